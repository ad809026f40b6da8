"""Model families, tiny local models, loading, and prompt -> model inputs.

families.py (what differs per family) -> tokenizer.py / tiny.py (offline tiny models) ->
loading.py (policy, reference, processor) -> inputs.py (one sample) -> mrope.py (position ids,
vLLM numbering) -> collate.py (mixed batches, dummy vision block) -> logprobs.py (chunked).
"""
