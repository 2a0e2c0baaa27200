"""``runner=attention``'s kernels and proof: Transformer Engine's DotProductAttention on
Megatron-Core's groups (``te``), the pure-torch a2a+p2p reference (``reference``) and the
numerics proof that CP is active (``verify``). Job side: imports only the job package and
the contract.
"""
