"""The `speculative:` section of kev.yaml: prompt-lookup drafts verified in the question's own channel.

Drafts never change an answer (docs/design.md, "Speculative decoding"): they only decide how many of a question's
next positions one step computes. A request may set its own (`speculative` on the Kev API, vLLM's
`speculative_config` on the OpenAI routes); the section is the default of a request that sets none.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class SpeculativeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # off: one row per decoding question a step; prompt_lookup: up to max_draft tokens copied from the question's own
    # prompt and answer after its last min_match..max_match tokens, verified as extra rows of its channel.
    method: Literal["off", "prompt_lookup"] = "off"
    max_draft: int = Field(8, ge=1, le=64)
    min_match: int = Field(2, ge=1, le=32)
    max_match: int = Field(4, ge=1, le=32)  # the longest suffix looked up first (vLLM's prompt_lookup_max)
    # Adaptive: drafts are proposed only while the step holds at most this many rows (decode rows, prompt chunks and
    # drafts together). Past it a step is compute-bound and an extra row costs about what a plain step's token does
    # (bench/results/speculative.md measures where).
    max_step_rows: int = Field(8, ge=1, le=4096)
    # measured: within that cap, a step takes only the draft rows whose expected kept tokens pay for the time they
    # add, by the engine's own measured step times and acceptance (kev/engine/draft_costs.py); rows: every draft
    # the cap allows (what `kev verify --speculative` and the tests use, to see drafts whatever the machine).
    policy: Literal["measured", "rows"] = "measured"

    @model_validator(mode="after")
    def _match_range(self) -> SpeculativeConfig:
        if self.max_match < self.min_match:
            raise ValueError(f"speculative.max_match ({self.max_match}) must be >= speculative.min_match "
                             f"({self.min_match})")
        return self
