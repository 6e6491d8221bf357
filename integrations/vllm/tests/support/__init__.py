"""Fixtures for tests, benchmarks and examples, not the plugin: a local
random-weight model maker (`models`), an in-process engine (`engine`), a
`vllm serve` launcher on a local model (`launcher`; not to be confused with
`kvgate_vllm.serve`, the gate inside `vllm serve`) and the agent workload
(`workload`). Nothing in the runtime package (`plugin`, `probes`, `serve`,
`feedback`, `knobs`, `prefill_rate`) imports them."""
