"""One rank of tests/space/test_pp_groups_gloo.py: build Megatron-Core's groups for tp=1, cp=4 as
[2,2], pp=2 on gloo and write every rank's CP, HCP-level and pipeline groups (rank 0).

Started as a plain process with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set; argv[1] is
the JSON file rank 0 writes.
"""
import json
import sys
from datetime import timedelta

import torch.distributed as dist
from megatron.core import parallel_state as ps

dist.init_process_group("gloo", timeout=timedelta(seconds=120))
ps.initialize_model_parallel(
    tensor_model_parallel_size=1, pipeline_model_parallel_size=2, context_parallel_size=4,
    hierarchical_context_parallel_sizes=[2, 2], create_gloo_process_groups=False,
)
a2a, p2p = ps.get_hierarchical_context_parallel_groups()
mine = {
    "cp": dist.get_process_group_ranks(ps.get_context_parallel_group()),
    "a2a": dist.get_process_group_ranks(a2a),
    "p2p": dist.get_process_group_ranks(p2p),
    "pp": dist.get_process_group_ranks(ps.get_pipeline_model_parallel_group()),
}
everyone = [None] * dist.get_world_size()
dist.all_gather_object(everyone, mine)
if dist.get_rank() == 0:
    with open(sys.argv[1], "w") as f:
        json.dump(everyone, f)
dist.barrier()
dist.destroy_process_group()
