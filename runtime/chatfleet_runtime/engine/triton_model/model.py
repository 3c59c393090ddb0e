"""Triton Python-backend adapter for the chat model ``chat``, the repository's one model (decoupled).

Thin by design: ``initialize`` parses the config and loads once (through ``ChatService``, with
``ModelObserver`` recording its metrics), ``execute`` hands each valid request to the in-flight engine
(``ChatService.submit``; with ``inflight_batching: false``, one ``ChatService.run`` per dynamic batch)
and every request is answered exactly once; errors go into the response, never raised. A request gets
text deltas as they are generated and always a final response flagged
``TRITONSERVER_RESPONSE_COMPLETE_FINAL``; a request with ``"stream": false`` gets no deltas and its whole
text in that final response, so streamed and non-streamed requests share one running batch.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import triton_python_backend_utils as pb_utils

from chatfleet_runtime.engine import load_watch
from chatfleet_runtime.engine.model_metrics import ModelObserver
from chatfleet_runtime.engine.service import ChatService, Prepared, ServiceSettings, error_message

log = logging.getLogger("chatfleet.model")


def _outputs(text: str, num_tokens: int, finish: str, prompt_tokens: int = 0):
    return [
        pb_utils.Tensor("TEXT", np.array([text.encode("utf-8")], dtype=np.object_)),
        pb_utils.Tensor("NUM_TOKENS", np.array([num_tokens], dtype=np.int32)),
        pb_utils.Tensor("FINISH_REASON", np.array([finish.encode("utf-8")], dtype=np.object_)),
        pb_utils.Tensor("PROMPT_TOKENS", np.array([prompt_tokens], dtype=np.int32)),
    ]


def _scalar(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return None
    return tensor.as_numpy().reshape(-1)[0]


class TritonPythonModel:
    """The chat model: requests join the running batch (in-flight batching); deltas, then a final response."""

    def initialize(self, args):
        """Parse the model config and load the model once, on this instance's GPU (with a warm-up)."""
        config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(config):
            raise pb_utils.TritonModelException(
                f"model {args['model_name']!r}: the chat model must be decoupled "
                "(model_transaction_policy { decoupled: true }, as chatfleet_contract.tritonconfig renders it)"
            )
        # Loads on the GPU Triton assigned this instance (args['model_instance_device_id']).
        settings = ServiceSettings.from_triton_args(args)
        marks = load_watch.LoadMarks.for_server()
        marks.begin(args["model_instance_name"])
        observer = ModelObserver(pb_utils.MetricFamily, args["model_name"], args.get("model_version", "1"))
        self.service = ChatService(settings, observer)
        # Into Triton's log (the stub's Python logging has no handler): what the KV cache was sized to.
        pb_utils.Logger.log_info(f"kv cache: {self.service.kv.describe()}")
        self.inflight = settings.inflight_batching
        if self.inflight:
            self.service.start_inflight()
        # From here a load that Triton never completes ends this stub (see load_watch).
        load_watch.start_watch(args["model_instance_name"], marks, settings.load_handshake_timeout_s)

    def execute(self, requests):
        """Answer every request of the batch exactly once: deltas (unless `stream: false`), then a final flag."""
        prepared, senders = [], []
        for request in requests:
            sender = request.get_response_sender()
            senders.append(sender)
            try:
                prepared.append(
                    self.service.prepare(
                        _scalar(request, "MESSAGES"),
                        _scalar(request, "PARAMETERS"),
                        on_text=self._streamer(sender),
                        is_cancelled=sender.is_cancelled,
                    )
                )
            except Exception as exc:  # never let one request break the batch
                log.exception("prepare failed")
                prepared.append(Prepared(error=f"internal: {exc}"))
        if self.inflight:
            # Continuous batching: valid requests join the engine's running batch, which sends their
            # deltas and final responses. Invalid ones are answered (final) right here.
            for prep, sender in zip(prepared, senders, strict=True):
                if prep.request is None:
                    self._send_final(
                        sender, pb_utils.InferenceResponse(error=pb_utils.TritonError(prep.error))
                    )
                else:
                    self.service.submit(prep.request, self._finisher(sender, prep.request.on_text is None))
            return None
        # Static mode (inflight_batching: false): one batched generate per dynamic batch, answered here.
        good = [p.request for p in prepared if p.request is not None]
        try:
            results = iter(self.service.run(good))
            error = None
        except Exception as exc:
            log.exception("generate failed")
            results, error = iter(()), f"internal: generate failed: {exc}"
        for prep, sender in zip(prepared, senders, strict=True):
            result = next(results) if prep.request is not None and error is None else None
            if result is None or result.error is not None:
                message = prep.error or error or error_message(result.error_kind, result.error)
                response = pb_utils.InferenceResponse(error=pb_utils.TritonError(message))
            else:
                # Streamed rows sent their text as deltas; the rest (`stream: false`) get it here.
                text = "" if prep.request.on_text is not None else result.text
                response = pb_utils.InferenceResponse(
                    _outputs(text, len(result.token_ids), result.finish_reason, result.prompt_tokens)
                )
            self._send_final(sender, response)
        return None

    @staticmethod
    def _send_final(sender, response):
        try:
            sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception:  # the client went away: nothing left to answer
            log.info("final response not delivered (client gone)")

    def _finisher(self, sender, with_text: bool):
        def on_done(result, error):
            if error is not None:
                kind = getattr(error, "kind", "internal")
                message = error_message(
                    kind, str(error) if kind in ("invalid", "overloaded") else f"generate failed: {error}"
                )
                response = pb_utils.InferenceResponse(error=pb_utils.TritonError(message))
            else:
                text = result.text if with_text else ""
                response = pb_utils.InferenceResponse(
                    _outputs(text, len(result.token_ids), result.finish_reason, result.prompt_tokens)
                )
            self._send_final(sender, response)

        return on_done

    @staticmethod
    def _streamer(sender):
        def on_text(delta: str, tokens: int, prompt_tokens: int) -> None:
            try:
                sender.send(pb_utils.InferenceResponse(_outputs(delta, tokens, "", prompt_tokens)))
            except Exception:
                pass  # cancelled or gone; is_cancelled ends the row

        return on_text

    def finalize(self):
        """Stop the in-flight engine and release the model."""
        if self.service is not None:
            self.service.close()
        self.service = None
