"""Engine-agnostic job-master logic after Flink's scheduler: the stage graph, consumed
partition groups, pipelined regions, partition release, shared compressed deployment
descriptors, adaptive parallelism, skew splitting and placement."""

from scheduling.deployment import (
    ConsumerDeploymentDescriptor,
    DescriptorCache,
    GateReference,
    GroupInput,
    consumer_deployments,
    even_reads,
    planned_reads,
    resolve_gate,
)
from scheduling.graph import ExecutionVertexID, Stage, StageExchange, StageGraph
from scheduling.groups import ConsumedPartitionGroup, ConsumerVertexGroup, build_groups
from scheduling.parallelism import ParallelismBounds, ranges_by_bytes, split_evenly
from scheduling.placement import (
    LocalInputPreferredPlacement,
    PlacementStrategy,
    TaskBalancedPlacement,
)
from scheduling.producer_bytes import MatrixBytes, ProducerBytes
from scheduling.regions import PipelinedRegion, RegionTopology, build_regions
from scheduling.release import PartitionReleaser
from scheduling.skew import ConsumerPlan, SkewOptions, plan_consumers

__all__ = [
    "ConsumedPartitionGroup",
    "ConsumerDeploymentDescriptor",
    "ConsumerPlan",
    "ConsumerVertexGroup",
    "DescriptorCache",
    "ExecutionVertexID",
    "GateReference",
    "GroupInput",
    "LocalInputPreferredPlacement",
    "MatrixBytes",
    "ParallelismBounds",
    "PartitionReleaser",
    "PipelinedRegion",
    "PlacementStrategy",
    "ProducerBytes",
    "RegionTopology",
    "SkewOptions",
    "Stage",
    "StageExchange",
    "StageGraph",
    "TaskBalancedPlacement",
    "build_groups",
    "build_regions",
    "consumer_deployments",
    "even_reads",
    "plan_consumers",
    "planned_reads",
    "ranges_by_bytes",
    "resolve_gate",
    "split_evenly",
]
