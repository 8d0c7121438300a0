# The attention-free signals of docs/tiers.md, named once for the scripts that run them (sourced by
# tools/eval/protocol, which runs them inside its main runs, and tools/eval/query-signal, which runs them alone
# beside the reference rows): MemDecay-lifetime observing only the queries through fp16 Quest min/max page digests
# (+query: bound_softmax; +query-tokens: bound_softmax_tokens; +query-last: the last query only), the key norm
# (+knorm, kvpress's KnormPress) and the page-mass signal (+page-mass).
# shellcheck shell=bash
attention_free_policies=memdecay-lifetime+query,memdecay-lifetime+query-tokens,memdecay-lifetime+query-last,memdecay-lifetime+knorm,memdecay-lifetime+page-mass
