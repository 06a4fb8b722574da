"""The conformance kit: every shuffle implementation passes the same suite.

Use it from an implementation's tests::

    from shuffle_api.testing import ConformanceHarness, ShuffleServiceConformance

    class TestMyService(ShuffleServiceConformance):  # or PipelinedPartitionConformance
        @pytest.fixture
        def harness(self, tmp_path) -> ConformanceHarness:
            return ConformanceHarness(Configuration.load({...}, environ={}), stored_files=...)
"""

from shuffle_api.master import RecordingJobContext
from shuffle_api.testing.deployment import LocalDeployment, LocalDeploymentFactory
from shuffle_api.testing.harness import ConformanceHarness, ShuffleScenario, make_batches
from shuffle_api.testing.suite import PipelinedPartitionConformance, ShuffleServiceConformance

__all__ = [
    "ConformanceHarness",
    "LocalDeployment",
    "LocalDeploymentFactory",
    "PipelinedPartitionConformance",
    "RecordingJobContext",
    "ShuffleScenario",
    "ShuffleServiceConformance",
    "make_batches",
]
