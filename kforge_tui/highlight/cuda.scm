; CUDA C++ highlighting for kforge-tui's kernel view.
; tree-sitter-cuda's own query only says "inherits: cpp", and TextArea takes one query, so the C,
; C++ and CUDA parts are joined here. Every capture name below has a style in kforge_tui.highlight.
; Captures never overlap (TextArea applies them in no fixed order), hence the #not-match? below.

(comment) @comment

[
  (string_literal)
  (raw_string_literal)
  (char_literal)
  (system_lib_string)
] @string

(number_literal) @number
[(true) (false)] @boolean
[(null) "nullptr" "NULL"] @constant.builtin
((identifier) @constant
  (#match? @constant "^[A-Z][A-Z0-9_]+$"))

; C keywords
[
  "break" "case" "continue" "default" "do" "else" "for" "goto" "if" "return" "switch" "while"
  "sizeof" "typedef" "struct" "union" "enum" "asm" "__asm__" "offsetof" "alignof"
] @keyword

; C++ keywords
[
  "class" "namespace" "template" "typename" "using" "operator" "new" "delete" "try" "catch"
  "throw" "public" "private" "protected" "virtual" "override" "final" "friend" "explicit"
  "noexcept" "decltype" "static_assert" "concept" "requires" "co_await" "co_return" "co_yield"
  "mutable" "constexpr" "consteval" "constinit" "thread_local"
] @keyword
(this) @variable.builtin
(auto) @type.builtin

; storage and type qualifiers (const, volatile, restrict parse as type_qualifier)
[
  "extern" "static" "register" "inline" "const" "volatile" "restrict" "_Atomic"
  (storage_class_specifier)
] @keyword

[
  "#include" "#define" "#if" "#ifdef" "#ifndef" "#else" "#elif" "#endif"
  (preproc_directive)
] @preprocessor
(preproc_def name: (identifier) @constant)
(preproc_function_def name: (identifier) @function)

[
  "=" "+=" "-=" "*=" "/=" "%=" "&=" "|=" "^=" "<<=" ">>="
  "+" "-" "*" "/" "%" "++" "--" "==" "!=" "<" ">" "<=" ">=" "&&" "||" "!"
  "&" "|" "^" "~" "<<" ">>" "->" "?" "::"
] @operator
["(" ")" "[" "]" "{" "}"] @punctuation.bracket
["," ";" "." ":"] @punctuation.delimiter

(primitive_type) @type.builtin
(sized_type_specifier) @type.builtin
(type_identifier) @type
(namespace_identifier) @namespace
(field_identifier) @property
(statement_identifier) @label

(function_declarator declarator: (identifier) @function)
(function_declarator declarator: (field_identifier) @function)
(function_declarator declarator: (qualified_identifier name: (identifier) @function))
((call_expression function: (identifier) @function.call)
  (#not-match? @function.call "^(__[a-z]|atomic[A-Z])"))
(call_expression function: (field_expression field: (field_identifier) @function.call))
(call_expression function: (qualified_identifier name: (identifier) @function.call))
(template_function name: (identifier) @function.call)

; CUDA: launch syntax, execution-space and memory qualifiers, built-in variables, intrinsics
["<<<" ">>>"] @punctuation.bracket
[
  "__global__" "__device__" "__host__" "__shared__" "__constant__" "__managed__"
  "__restrict__" "__forceinline__" "__noinline__" "__launch_bounds__" "__grid_constant__"
] @keyword.cuda
((identifier) @variable.builtin
  (#any-of? @variable.builtin "threadIdx" "blockIdx" "blockDim" "gridDim" "warpSize"))
((call_expression function: (identifier) @function.cuda)
  (#match? @function.cuda "^(__[a-z]|atomic[A-Z])"))
