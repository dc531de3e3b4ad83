"""The vLLM-facing half of the pool: `PoolConnector` (vLLM's KV connector
interface) in `pool`, its model-runner half in `worker_side`.

vLLM loads it as `kv_connector_module_path = "kvpool.connector.pool"`. This
package's `__init__` imports nothing, so the pure parts of `kvpool` and the
worker's HTTP side never pull vLLM in through it.
"""
