"""The Tinker SDK's wire shapes, to and from numpy: its protobuf messages and JSON inputs.

Owns: reading a ``ForwardBackwardRequest`` (protobuf, the only form the SDK 0.38.0 sends it
in) into plain data (``Datum``: the tokens of the model input and the ``loss_fn_inputs`` as
arrays), reading a JSON ``ModelInput`` (``asample``'s prompt), and writing the two results
the SDK accepts only as protobuf: ``ForwardBackwardOutput`` and ``SampleResponse``. Uses the
SDK's own generated module (``tinker.proto``), so the fields are the SDK's by construction.
A malformed body is a ``WireError`` naming the field and what it should hold.
Must not know: what a loss computes, jobs, the runtime.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from tinker.proto import tinker_public_pb2 as pb

_DTYPES = {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_INT64: np.int64, pb.DTYPE_INT32: np.int32}


class WireError(ValueError):
    """A request body that does not hold what the SDK sends."""


@dataclass(frozen=True)
class Datum:
    tokens: np.ndarray                               #: int64 (N,), the model input
    inputs: dict[str, np.ndarray] = field(default_factory=dict)   #: loss_fn_inputs


@dataclass(frozen=True)
class ForwardBackward:
    model_id: str
    seq_id: int
    loss_fn: str
    forward_only: bool
    config: dict[str, float]                         #: loss_fn_config (numbers only)
    data: tuple[Datum, ...]


def read_forward_backward(body: bytes) -> ForwardBackward:
    """A protobuf ``ForwardBackwardRequest``."""
    msg = pb.ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except Exception as err:   # protobuf's DecodeError
        raise WireError(f"the body is not a protobuf ForwardBackwardRequest ({err}); send it "
                        "with the tinker SDK's forward_backward") from None
    config = {k: float(v) for k, v in msg.loss_fn_config.items()}
    for k, v in msg.loss_fn_config_v2.items():
        if v.WhichOneof("value") == "text":
            raise WireError(f"loss_fn_config[{k!r}] is text ({v.text!r}); the losses here take "
                            "numbers only")
        config[k] = float(v.number)
    data = tuple(_datum(i, d) for i, d in enumerate(msg.data))
    return ForwardBackward(msg.model_id, int(msg.seq_id), msg.loss_fn, bool(msg.forward_only),
                           config, data)


def _datum(i: int, msg) -> Datum:
    parts = []
    for chunk in msg.model_input:
        kind = chunk.WhichOneof("chunk")
        if kind != "encoded_text":
            raise WireError(f"datum {i}: a model_input chunk of kind {kind!r}; this server "
                            "takes text tokens only (EncodedTextChunk)")
        parts.append(np.frombuffer(chunk.encoded_text.tokens, dtype="<i4"))
    tokens = np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)
    inputs = {name: _tensor(f"datum {i}: loss_fn_inputs[{name!r}]", t)
              for name, t in msg.loss_fn_inputs.items()}
    return Datum(tokens, inputs)


def _tensor(where: str, msg) -> np.ndarray:
    dtype = _DTYPES.get(msg.dtype)
    if dtype is None:
        raise WireError(f"{where}: dtype {msg.dtype} is not float32 or int64")
    shape = tuple(int(s) for s in msg.shape)
    if msg.WhichOneof("encoding") == "sparse_csr":
        csr = msg.sparse_csr
        values = np.frombuffer(csr.values, dtype=np.dtype(dtype).newbyteorder("<"))
        crow = np.frombuffer(csr.crow_indices, dtype="<i8")
        col = np.frombuffer(csr.col_indices, dtype="<i8")
        if len(shape) != 2 or len(crow) != shape[0] + 1 or len(col) != len(values):
            raise WireError(f"{where}: a sparse CSR tensor whose indices do not fit shape {shape}")
        dense = np.zeros(shape, dtype)
        rows = np.repeat(np.arange(shape[0]), np.diff(crow))
        dense[rows, col] = values
        return dense
    flat = np.frombuffer(msg.dense, dtype=np.dtype(dtype).newbyteorder("<")).astype(dtype)
    if shape and int(np.prod(shape)) != flat.size:
        raise WireError(f"{where}: {flat.size} values for shape {list(shape)}")
    return flat.reshape(shape) if shape else flat


def read_forward_backward_json(body: dict) -> ForwardBackward:
    """The same request as JSON (the SDK's pydantic ``ForwardBackwardRequest``)."""
    fb = body.get("forward_backward_input")
    if not isinstance(fb, dict) or not isinstance(fb.get("data"), list):
        raise WireError("forward_backward_input.data must be a list of Datum")
    config = fb.get("loss_fn_config") or {}
    if not isinstance(config, dict) or not all(isinstance(v, (int, float))
                                               for v in config.values()):
        raise WireError("loss_fn_config must map names to numbers")
    data = []
    for i, datum in enumerate(fb["data"]):
        if not isinstance(datum, dict):
            raise WireError(f"datum {i} is not an object")
        inputs = datum.get("loss_fn_inputs") or {}
        if not isinstance(inputs, dict):
            raise WireError(f"datum {i}: loss_fn_inputs must be an object")
        data.append(Datum(read_model_input(f"datum {i}: model_input", datum.get("model_input")),
                          {k: _json_tensor(f"datum {i}: loss_fn_inputs[{k!r}]", v)
                           for k, v in inputs.items()}))
    return ForwardBackward(str(body.get("model_id", "")), int(body.get("seq_id") or 0),
                           str(fb.get("loss_fn", "")),
                           bool(body.get("forward_only")) or body.get("type") == "forward",
                           {k: float(v) for k, v in config.items()}, tuple(data))


def _json_tensor(where: str, value) -> np.ndarray:
    if not isinstance(value, dict) or not isinstance(value.get("data"), list):
        raise WireError(f"{where} must be a TensorData ({{'data': [...], 'dtype': ...}})")
    dtype = {"float32": np.float32, "int64": np.int64}.get(value.get("dtype"))
    if dtype is None:
        raise WireError(f"{where}: dtype {value.get('dtype')!r} is not float32 or int64")
    try:
        flat = np.asarray(value["data"], dtype=dtype)
    except (TypeError, ValueError):
        raise WireError(f"{where}: data must be numbers") from None
    shape = value.get("shape")
    if value.get("sparse_crow_indices") is not None:
        raise WireError(f"{where}: sparse tensors come over protobuf only here")
    if shape and int(np.prod(shape)) != flat.size:
        raise WireError(f"{where}: {flat.size} values for shape {shape}")
    return flat.reshape(shape) if shape else flat


def read_model_input(where: str, value) -> np.ndarray:
    """The tokens of a JSON ``ModelInput`` (``{"chunks": [{"type": "encoded_text", ...}]}``)."""
    chunks = value.get("chunks") if isinstance(value, dict) else None
    if not isinstance(chunks, list):
        raise WireError(f"{where} must be a ModelInput ({{'chunks': [...]}}), got {value!r:.80}")
    tokens = []
    for chunk in chunks:
        if not isinstance(chunk, dict) or chunk.get("type", "encoded_text") != "encoded_text":
            raise WireError(f"{where}: a chunk that is not encoded text ({chunk!r:.60}); this "
                            "server takes text tokens only (EncodedTextChunk)")
        tokens.extend(chunk.get("tokens") or ())
    if not all(isinstance(t, int) for t in tokens):
        raise WireError(f"{where}: tokens must be integers")
    return np.asarray(tokens, dtype=np.int64)


def write_forward_backward_output(loss_fn: str, metrics: dict[str, float],
                                  outputs: dict[str, list[np.ndarray]]) -> bytes:
    """A protobuf ``ForwardBackwardOutput``: one record, a float32 field per output name,
    each datum's values back to back (``offsets`` in bytes)."""
    msg = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord")
    for key, value in metrics.items():
        msg.metrics[key] = float(value)
    record = msg.loss_fn_outputs.add()
    record.type_tag = "ArrayRecord"
    record.num_datums = len(next(iter(outputs.values()), ()))
    for name, per_datum in outputs.items():
        arrays = [np.ascontiguousarray(a, dtype="<f4").reshape(-1) for a in per_datum]
        offsets = np.cumsum([0] + [a.nbytes for a in arrays]).astype("<i8")
        tensor = record.fields[name]
        tensor.dtype = pb.DTYPE_FLOAT32
        tensor.data = b"".join(a.tobytes() for a in arrays)
        tensor.offsets = offsets.tobytes()
    return msg.SerializeToString()


def write_sample_response(tokens: list[np.ndarray], logprobs: list[np.ndarray],
                          stopped: list[bool], prompt_logprobs: np.ndarray | None) -> bytes:
    """A protobuf ``SampleResponse``: the sequences, and the prompt's logprobs (NaN where a
    position has none, the first) when asked for."""
    msg = pb.SampleResponse()
    for toks, lps, stop in zip(tokens, logprobs, stopped):
        seq = msg.sequences.add()
        seq.stop_reason = pb.STOP_REASON_STOP if stop else pb.STOP_REASON_LENGTH
        seq.tokens = np.asarray(toks, dtype="<i4").tobytes()
        seq.logprobs = np.asarray(lps, dtype="<f4").tobytes()
    if prompt_logprobs is not None:
        msg.prompt_logprobs = np.asarray(prompt_logprobs, dtype="<f4").tobytes()
    return msg.SerializeToString()
