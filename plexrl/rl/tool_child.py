"""The program a tool call runs as: a child Python process that limits itself, then evaluates.

Run as a script (``python -I -S tool_child.py``), never imported by the parent's code path:
it reads one JSON request on stdin (``mode``, ``source``, ``nonce``, ``limits``), sets
RLIMIT_AS / RLIMIT_CPU / RLIMIT_FSIZE / RLIMIT_CORE on itself *before* touching ``source``,
evaluates it, and writes one line ``<nonce><json>`` on stdout with ``kind`` ("ok", "error",
"memory") and ``text``. A CPU-limit or a signal kill writes nothing: the parent reads the
exit status instead.

Modes: ``arith`` walks the expression's AST and allows only number literals and arithmetic
operators (no names, calls, attributes), with exponents capped; ``python`` runs untrusted
code (an expression's value, or the ``result`` a statement block binds), which is why it
runs only here, under the limits.
Owns: the limits and the evaluation. Must not know: plexrl (it imports only the stdlib, so
``-I -S`` startup stays small under RLIMIT_AS), the model, the rollout, the tokenizer.
"""

import ast
import json
import operator
import resource
import sys

MAX_EXPONENT = 256
MAX_TEXT = 200      #: characters of a result kept (the rollout shows the model fewer)
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
           ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def arith(node):
    """The value of an arithmetic AST node; ValueError on anything else."""
    if isinstance(node, ast.Expression):
        return arith(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](arith(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = arith(node.left), arith(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError(f"exponent {right} over {MAX_EXPONENT}")
        return _BINARY[type(node.op)](left, right)
    raise ValueError(f"not arithmetic: {type(node).__name__}")


def run_python(source: str):
    """An expression's value, else exec the block and return its ``result`` (None if unset)."""
    try:
        code = compile(source, "<tool>", "eval")
    except SyntaxError:
        scope = {"__name__": "__tool__"}
        exec(compile(source, "<tool>", "exec"), scope)
        return scope.get("result")
    return eval(code, {"__name__": "__tool__"})


def fmt(value) -> str:
    if isinstance(value, float):
        return format(value, ".6g")
    return str(value)


def limit(limits: dict) -> None:
    """Limits on this process (inherited by anything it forks)."""
    cpu = int(limits["cpu_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))   # SIGXCPU, then SIGKILL
    resource.setrlimit(resource.RLIMIT_AS, (limits["as_bytes"], limits["as_bytes"]))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["fsize_bytes"], limits["fsize_bytes"]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def main() -> None:
    request = json.loads(sys.stdin.read())
    limit(request["limits"])
    try:
        if request["mode"] == "arith":
            value = arith(ast.parse(request["source"].strip(), mode="eval"))
        else:
            value = run_python(request["source"])
        out = {"kind": "ok", "text": fmt(value)[:MAX_TEXT]}
    except MemoryError:
        out = {"kind": "memory", "text": "MemoryError"}
    except BaseException as err:   # noqa: BLE001 -- whatever the tool raised is its result
        out = {"kind": "error", "text": f"{type(err).__name__}: {err}"[:MAX_TEXT]}
    sys.stdout.write("\n" + request["nonce"] + json.dumps(out) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
