"""Asyncio façade over :class:`LLMEngine` for the server.

One background thread runs the step loop (torch releases the GIL inside kernels, so the event
loop stays responsive). Requests and aborts reach that thread through an inbox; each step's
outputs go back to the per-request ``asyncio.Queue`` in one ``loop.call_soon_threadsafe``.

:meth:`AsyncEngine.from_config` loads the models on that same thread, so the step thread is
the only thread of the serving process that runs torch's parallel regions. That matters on
CPU: every thread that starts an OpenMP parallel region keeps a team of worker threads of its
own, and once the process holds more OpenMP threads than there are CPUs, GNU OpenMP spins
only briefly before a worker sleeps, so each of a step's many parallel regions starts by
waking one. Loading on one thread and stepping on another made each step 10–20 % slower
(``benchmarks/engine_thread.py`` shows the effect).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from specserve.config import EngineConfig
from specserve.engine.builder import build_engine
from specserve.engine.errors import EngineDeadError, EngineShutdownError, QueueFullError
from specserve.engine.llm_engine import LLMEngine
from specserve.engine.outputs import EngineStats, RequestOutput
from specserve.models.arch import ArchConfig
from specserve.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


@dataclass
class _Add:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams


@dataclass
class _Abort:
    request_id: str


_Item = RequestOutput | BaseException


class _Stream:
    """Where one request's outputs are delivered (lives on the event loop)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: asyncio.Queue[_Item] = asyncio.Queue()


class AsyncEngine:
    """The engine as the server sees it.

    Attributes:
        engine: the synchronous engine, touched only by the step thread after start.
        tokenizer: the target's tokenizer (None for token-id-only engines in tests).
        arch: the target's architecture.
        model_name: name reported by the server.
        max_model_len: context limit (prompt + output tokens).
    """

    def __init__(self, engine: LLMEngine, tokenizer: Any = None) -> None:
        """Wrap an engine that is already built and start stepping it on a new thread."""
        self._init_state()
        self._attach(engine, tokenizer)
        self._thread = threading.Thread(target=self._run, name="specserve-engine", daemon=True)
        self._thread.start()

    def _init_state(self) -> None:
        self._cv = threading.Condition()
        self._inbox: list[_Add | _Abort] = []
        self._num_pending_adds = 0
        self._streams: dict[str, _Stream] = {}
        self._stopping = False
        self._dead: BaseException | None = None
        self._rejected: dict[str, int] = {}

    def _attach(self, engine: LLMEngine, tokenizer: Any = None) -> None:
        self.engine = engine
        self.tokenizer = tokenizer if tokenizer is not None else engine.tokenizer
        self.arch: ArchConfig = engine.model.cfg
        self.model_name = engine.model_name
        self.max_model_len = engine.max_model_len
        self._stats = engine.stats()

    @classmethod
    def from_config(cls, config: EngineConfig) -> AsyncEngine:
        """Load the target (and the draft, for method ``draft``) and build the engine."""
        return cls.build_on_step_thread(lambda: build_engine(config))

    @classmethod
    def build_on_step_thread(cls, build: Callable[[], LLMEngine]) -> AsyncEngine:
        """Start the step thread, run ``build`` on it, and return once the engine is built.

        The models are loaded (and their first ops run) on the thread that will step them, so
        no second thread of the process ever starts a parallel region (see the module
        docstring). Blocks the caller until ``build`` returns; re-raises what it raised, and
        the thread then ends.
        """
        wrapper = cls.__new__(cls)
        wrapper._init_state()
        built: concurrent.futures.Future[None] = concurrent.futures.Future()

        def boot() -> None:
            try:
                wrapper._attach(build())
            except BaseException as exc:
                built.set_exception(exc)
                return
            built.set_result(None)
            wrapper._run()

        wrapper._thread = threading.Thread(target=boot, name="specserve-engine", daemon=True)
        wrapper._thread.start()
        built.result()
        return wrapper

    # --- client side (event loop) ------------------------------------------------------------

    def _reject(self, reason: str) -> None:
        with self._cv:
            self._rejected[reason] = self._rejected.get(reason, 0) + 1

    async def generate(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams
    ) -> AsyncIterator[RequestOutput]:
        """Stream a request's outputs, one per engine step that committed tokens.

        Raises:
            ValueError: bad request (empty or too long prompt, duplicate id, ...).
            QueueFullError: the waiting queue is at ``max_queue_len``.
            EngineShutdownError / EngineDeadError: the engine accepts no requests.
        """
        if self._dead is not None:
            raise EngineDeadError(f"engine step loop failed: {self._dead!r}")
        if self._stopping:
            raise EngineShutdownError("engine is shutting down")
        try:
            self.engine.validate(prompt_token_ids, params)  # reads immutable state only
            if request_id in self._streams:
                raise ValueError(f"request id {request_id!r} is already in use")
        except ValueError:
            self._reject("bad_request")
            raise
        stream = _Stream(asyncio.get_running_loop())
        with self._cv:
            bound = self.engine.scheduler.config.max_queue_len
            if len(self.engine.scheduler.waiting) + self._num_pending_adds >= bound:
                self._rejected["queue_full"] = self._rejected.get("queue_full", 0) + 1
                raise QueueFullError(f"waiting queue is full ({bound} requests); retry later")
            self._streams[request_id] = stream
            self._inbox.append(_Add(request_id, list(prompt_token_ids), params))
            self._num_pending_adds += 1
            self._cv.notify()
        finished = False
        try:
            while True:
                item = await stream.queue.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            if self._streams.get(request_id) is stream:
                del self._streams[request_id]
            if not finished:  # the consumer went away (client disconnect): free the blocks
                self._submit(_Abort(request_id))

    def _submit(self, cmd: _Add | _Abort) -> None:
        with self._cv:
            self._inbox.append(cmd)
            self._cv.notify()

    async def abort(self, request_id: str) -> None:
        """Stop a request and free its KV blocks (no-op for unknown or finished ids)."""
        self._submit(_Abort(request_id))

    def stats(self) -> EngineStats:
        """The snapshot taken after the latest step, plus admission rejections."""
        snap = self._stats
        rejected = dict(snap.num_rejected)
        with self._cv:
            for reason, n in self._rejected.items():
                rejected[reason] = rejected.get(reason, 0) + n
        return dataclasses.replace(snap, num_rejected=rejected)

    async def shutdown(self, drain: bool = True) -> None:
        """Refuse new requests; finish (``drain``) or abort the running ones; stop the thread."""
        with self._cv:
            self._stopping = True
            if not drain:
                self._inbox.extend(_Abort(rid) for rid in list(self._streams))
            self._cv.notify()
        await asyncio.to_thread(self._thread.join)

    # --- step thread -------------------------------------------------------------------------

    def _deliver(self, items: list[tuple[str, _Item]]) -> None:
        """Group items by event loop and hand each group over in one thread-safe call."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Stream, _Item]]] = {}
        for rid, item in items:
            stream = self._streams.get(rid)
            if stream is not None:
                by_loop.setdefault(stream.loop, []).append((stream, item))
        for loop, group in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, group)
            except RuntimeError:  # the loop was closed: nobody is listening any more
                logger.debug("dropping %d outputs for a closed event loop", len(group))

    def _apply(self, commands: list[_Add | _Abort]) -> list[tuple[str, _Item]]:
        items: list[tuple[str, _Item]] = []
        for cmd in commands:
            if isinstance(cmd, _Add):
                try:
                    self.engine.add_request(cmd.request_id, cmd.prompt_token_ids, cmd.params)
                except (ValueError, QueueFullError) as e:
                    items.append((cmd.request_id, e))
            else:
                out = self.engine.abort_request(cmd.request_id)
                if out is not None:
                    items.append((cmd.request_id, out))
        return items

    def _run(self) -> None:
        engine = self.engine
        while True:
            with self._cv:
                while not (self._inbox or self._stopping or engine.has_unfinished_requests()):
                    self._cv.wait()
                commands, self._inbox = self._inbox, []
                self._num_pending_adds = 0
                if self._stopping and not commands and not engine.has_unfinished_requests():
                    break
            try:
                items = self._apply(commands)
                if engine.has_unfinished_requests():
                    items.extend((o.request_id, o) for o in engine.step())
                self._stats = engine.stats()
            except Exception as e:
                logger.exception("engine step failed; failing every request")
                self._dead = e
                dead = EngineDeadError(f"engine step failed: {e!r}")
                self._deliver([(rid, dead) for rid in list(self._streams)])
                return
            if items:
                self._deliver(items)


def _put_all(group: list[tuple[_Stream, _Item]]) -> None:
    for stream, item in group:
        stream.queue.put_nowait(item)
