"""Task-accuracy check of two arms over HTTP: HumanEval (executed in a sandbox) and generated
exact-answer questions, pass@1 per arm with 95 % CIs and the paired difference.

Speaks HTTP to the endpoints and runs generated code in a subprocess; never imports the
engine, the server or the models (tests/unit/test_layering.py).

Python API::

    from specserve.quality import ArmEndpoint, QualityConfig, run_quality
    report = run_quality(QualityConfig(), {"baseline": ArmEndpoint(url_a, "m"),
                                           "speculative": ArmEndpoint(url_b, "m")})
    report.summary()  # per task: each arm's pass@1 and CI, the delta and its CI
"""

from specserve.quality.client import ArmEndpoint
from specserve.quality.config import ExactConfig, HumanEvalConfig, QualityConfig
from specserve.quality.items import QualityTaskUnavailable
from specserve.quality.results import QualityReport
from specserve.quality.run import check_quality, run_quality, write_quality

__all__ = [
    "ArmEndpoint",
    "ExactConfig",
    "HumanEvalConfig",
    "QualityConfig",
    "QualityReport",
    "QualityTaskUnavailable",
    "check_quality",
    "run_quality",
    "write_quality",
]
