"""The bottom layer: pure data and decisions, no I/O. Op cards and the arg-spec format
(``argspec``: one encoder, walker, decoder, ``bind`` and ``resolve_op``), what a call read from
data makes (``meta``: learned on meta tensors, before it runs anywhere), candidates and their
launch plans (``launch_plan``: the closed grammar kforge interprets), the plug-in contracts
(``protocols``), the settings tree (``settings``), the MCTS tree (``mcts``) and search scheduling
(``schedule``, ``budget``, ``reward``). Imports nothing from the layers above."""
