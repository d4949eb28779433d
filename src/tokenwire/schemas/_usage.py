"""Token usage with disjoint counts."""

from __future__ import annotations

import msgspec


class TokenUsage(msgspec.Struct, frozen=True, omit_defaults=True):
    """Token counts of one step, disjoint so that their sum is what was billed.

    - ``input_tokens``: uncached input only. Providers that fold cache reads into the prompt
      total (OpenAI's ``cached_tokens``, DeepSeek's ``prompt_cache_hit_tokens``) have them
      subtracted back out by the adapter.
    - ``cache_read_tokens`` / ``cache_write_tokens``: input served from / written to the
      provider's prompt cache.
    - ``output_tokens``: generated tokens other than ``reasoning_tokens`` when the provider
      reports reasoning separately; all generated tokens when it does not.
    - ``reasoning_tokens``: generated reasoning tokens, when reported.

    A count the provider did not send is ``None``: absent, never estimated.
    """

    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None
    reasoning_tokens: int | None = None

    def total(self) -> int:
        """The sum of every count present."""
        return sum(
            n
            for n in (
                self.input_tokens,
                self.output_tokens,
                self.cache_read_tokens,
                self.cache_write_tokens,
                self.reasoning_tokens,
            )
            if n is not None
        )
