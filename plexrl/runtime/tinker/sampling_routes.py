"""The Tinker routes of sampling: sampling sessions and their samples.

Owns: ``create_sampling_session`` (on the ``sampler_weights`` checkpoint of a live model),
``samplers/{id}``, and ``asample``: a GENERATE at the session's weight version, and, for
prompt logprobs, a LOGPROBS of the prompt, issued in the session's own ``seq_id`` order and
answered as a future (protobuf, as the SDK reads it).
Must not know: scheduling, Ray, torch.
"""

from __future__ import annotations

import asyncio

import numpy as np

from plexrl.runtime.tinker import wire
from plexrl.runtime.tinker.futures import UserError
from plexrl.runtime.tinker.http import Reply, Request
from plexrl.runtime.tinker.model_routes import PROTO
from plexrl.runtime.tinker.tenants import NotFound, Tenants, body_of, error
from plexrl.runtime.tinker.training import TinkerModel, checked, in_turn


class SamplingRoutes:
    def __init__(self, tenants: Tenants):
        self.tenants = tenants
        self.routes = {
            ("POST", "/create_sampling_session"): self.create_sampling_session,
            ("POST", "/asample"): self.asample,
        }

    async def create_sampling_session(self, request: Request, key: str) -> Reply:
        body = body_of(request)
        self.tenants.own_session(key, body.get("session_id"),
                                 "create the sampling client from a ServiceClient of this key")
        path = body.get("model_path")
        if path is None:
            raise UserError("sampling a base model with no training client is not served "
                            "yet; fix: training_client.save_weights_and_get_sampling_client()")
        checkpoint = self.tenants.checkpoint(key, path)
        model = self.tenants.models.get(checkpoint.model_id)
        if model is None or model.ended or "/sampler_weights/" not in checkpoint.path:
            raise UserError(f"{path} is not the sampler weights of a live model; fix: "
                            "save_weights_for_sampler on a training client that is still open")
        sampler = self.tenants.new_sampler(key, model, checkpoint.version,
                                           f"{body['session_id']}:sample:"
                                           f"{body.get('sampling_session_seq_id', 0)}", path)
        return Reply(body={"sampling_session_id": sampler.sampler_id})

    def get_sampler(self, key: str, sampler_id: str) -> Reply:
        sampler = self.tenants.sampler(key, sampler_id)
        if sampler is None:
            return error(404, f"no sampler {sampler_id!r} of this key",
                         "use a sampling_session_id this key created")
        return Reply(body={"sampler_id": sampler_id, "base_model": sampler.model.base_model,
                           "model_path": sampler.model_path or None})

    async def asample(self, request: Request, key: str) -> Reply:
        body = body_of(request)
        sampler = self.tenants.sampler(key, body.get("sampling_session_id"))
        if sampler is None:
            raise NotFound(f"no sampling session {body.get('sampling_session_id')!r} of this "
                           "key", "sample from a sampling client this key created")
        seq = body.get("seq_id", 0)
        prompt, params, n, stop = checked(sampler.turns, seq,
                                          lambda: self.sample_args(body, sampler.model))
        want_prompt = bool(body.get("prompt_logprobs"))
        prompts = [prompt.tolist()] * n
        model = sampler.model

        def issue():
            if want_prompt and model.version != sampler.version:
                raise UserError(f"prompt logprobs of weights version {sampler.version}, but "
                                f"the model has moved on to {model.version}; fix: ask for them "
                                "before the next optim_step, or from a new sampling client")
            generated = model.job.generate(
                prompts, step=sampler.version, max_tokens=params["max_tokens"],
                temperature=float(params.get("temperature", 1.0)),
                top_p=float(params.get("top_p", 1.0)), stop=stop)
            scored = model.job.logprobs({"input_ids": np.asarray([prompt])}) \
                if want_prompt else None
            return generated, scored

        async def run():
            generated, scored = await in_turn(sampler.turns, seq, issue)
            out = await asyncio.wrap_future(generated)
            lengths = [int(v) for v in out["lengths"]]
            prompt_lps = None
            if scored is not None:
                prompt_lps = np.array((await asyncio.wrap_future(scored))["logprobs"][0],
                                      np.float32)
                prompt_lps[0] = np.nan
            return Reply(body=wire.write_sample_response(
                [out["tokens"][i, :k] for i, k in enumerate(lengths)],
                [out["logprobs"][i, :k] for i, k in enumerate(lengths)],
                [bool(s) for s in out["stopped"]], prompt_lps), content_type=PROTO)
        reply = self.tenants.ordered(key, sampler.requests, seq, run)
        request_id = reply.body["request_id"]
        return Reply(body={**reply.body,
                           "sample_sequence_ids": [f"{request_id}:{i}" for i in range(n)]})

    @staticmethod
    def sample_args(body: dict, model: TinkerModel):
        prompt = wire.read_model_input("prompt", body.get("prompt"))
        params = body.get("sampling_params") or {}
        n, max_tokens = body.get("num_samples", 1), params.get("max_tokens")
        if not prompt.size or prompt.min() < 0 or prompt.max() >= model.vocab_size:
            raise UserError(f"the prompt must be tokens in [0, {model.vocab_size}); fix: use "
                            "the model's tokenizer")
        if not isinstance(n, int) or n < 1 or not isinstance(max_tokens, int) or max_tokens < 1:
            raise UserError("num_samples and sampling_params.max_tokens must be >= 1; fix: "
                            "SamplingParams(max_tokens=...)")
        if params.get("top_k", -1) not in (-1, None, 0) or body.get("topk_prompt_logprobs"):
            raise UserError("top-k sampling and top-k prompt logprobs are not served; fix: "
                            "top_k=-1 and topk_prompt_logprobs=0")
        stop = params.get("stop") or ()
        if isinstance(stop, str) or not all(isinstance(t, int) for t in stop):
            raise UserError("stop must be token ids here (no tokenizer on the server); fix: "
                            "SamplingParams(stop=[token_id, ...])")
        return prompt, params, n, tuple(stop)
