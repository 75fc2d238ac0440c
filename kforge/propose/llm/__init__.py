"""The LLM agent proposer: candidate kernels written by a chat model behind any OpenAI-compatible
endpoint (OpenAI, vLLM, Ollama, llama.cpp's server). See ``docs/llm.md``."""

from kforge.propose.llm.proposer import LlmProposer, make_llm_proposer
from kforge.propose.llm.settings import LlmSettings, Price, load_llm_settings

__all__ = ["LlmProposer", "LlmSettings", "Price", "load_llm_settings", "make_llm_proposer"]
