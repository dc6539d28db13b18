"""The batched engine: request state, scheduler (continuous batching), model runner, the
engine step (schedule → draft → verify → commit), the asyncio façade and the builder.

Import from the modules: ``engine.llm_engine.LLMEngine``, ``engine.async_engine.AsyncEngine``,
``engine.builder.build_engine``, ``engine.outputs`` (what callers get back) and
``engine.errors`` (what the engine raises instead of taking a request).
"""
