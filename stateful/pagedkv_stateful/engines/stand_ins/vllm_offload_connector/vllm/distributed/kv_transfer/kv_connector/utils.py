"""Stand-in: vllm.distributed.kv_transfer.kv_connector.utils.yield_req_data.

vLLM's module also holds the worker-side helpers (attention backends, tensor copies),
which import the model executor; the scheduler side of the offloading connector reads
only this generator.
"""


def yield_req_data(scheduler_output):
    """(request id, block id groups, whether they are its whole block table), for each
    request the step scheduled: the new ones (their whole table), then the running ones
    (the blocks this step added), as vLLM 0.34.0 documents it."""
    for new in scheduler_output.scheduled_new_reqs:
        yield new.req_id, new.block_ids, True
    cached = scheduler_output.scheduled_cached_reqs
    for req_id, block_ids in zip(cached.req_ids, cached.new_block_ids, strict=True):
        yield req_id, block_ids, False
