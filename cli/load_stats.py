"""What `evolving-infra load` prints: per-request results folded into one
phase's numbers, its progress bar and its one-line summary (pure)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cli.load_plan import PhaseKind, fmt_s, percentile

BAR_WIDTH = 24


@dataclass(frozen=True)
class RequestResult:
    ok: bool
    e2e_s: float
    ttft_s: float | None = None  # to the first content chunk
    prompt_tokens: int = 0  # from the usage chunk (0 when the gateway sent none)
    cached_tokens: int = 0
    completion_tokens: int = 0
    error: str | None = None  # "HTTP 429: ...", "ReadTimeout: ..."
    interrupted: bool = False  # failed while the load was stopping (the gateway going down): not an error


@dataclass
class PhaseStats:
    number: int
    kind: PhaseKind
    agents: int
    results: list[RequestResult] = field(default_factory=list)

    def add(self, result: RequestResult) -> None:
        self.results.append(result)

    @property
    def ok(self) -> list[RequestResult]:
        return [r for r in self.results if r.ok]

    @property
    def errors(self) -> int:
        return sum(1 for r in self.results if not r.ok and not r.interrupted)

    @property
    def interrupted(self) -> int:
        return sum(1 for r in self.results if r.interrupted)

    def summary(self, elapsed_s: float) -> dict[str, Any]:
        """The phase's numbers (the `--json` line)."""
        ok = self.ok
        prompt = sum(r.prompt_tokens for r in ok)
        cached = sum(r.cached_tokens for r in ok)
        completion = sum(r.completion_tokens for r in ok)
        ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
        tpot = [
            (r.e2e_s - r.ttft_s) / (r.completion_tokens - 1)
            for r in ok
            if r.ttft_s is not None and r.completion_tokens > 1
        ]
        first_error = next((r.error for r in self.results if r.error and not r.interrupted), None)
        return {
            "phase": self.number,
            "kind": self.kind.value,
            "agents": self.agents,
            "elapsed_s": round(elapsed_s, 1),
            "requests": len(self.results),
            "errors": self.errors,
            "interrupted": self.interrupted,
            "prompt_tokens_mean": round(prompt / len(ok), 1) if ok else None,
            "cached_fraction": round(cached / prompt, 3) if prompt else None,
            "output_tokens_mean": round(completion / len(ok), 1) if ok else None,
            "ttft_p50_s": _round(percentile(ttft, 50)),
            "ttft_p95_s": _round(percentile(ttft, 95)),
            "tpot_mean_s": _round(sum(tpot) / len(tpot) if tpot else None),
            "e2e_mean_s": _round(sum(r.e2e_s for r in ok) / len(ok) if ok else None),
            "output_tokens_per_s": round(completion / elapsed_s, 1) if elapsed_s > 0 else 0.0,
            "first_error": first_error,
        }

    def line(self, elapsed_s: float) -> str:
        """The one-line summary printed when the phase ends."""
        s = self.summary(elapsed_s)
        cached = "-" if s["cached_fraction"] is None else f"{s['cached_fraction']:.0%}"
        interrupted = f", {s['interrupted']} cut short by the stop" if s["interrupted"] else ""
        text = (
            f"phase {s['phase']} {self.kind.label}: {s['elapsed_s']:.0f} s, {s['agents']} agents, "
            f"{s['requests']} requests ({s['errors']} errors{interrupted}), "
            f"prompt {s['prompt_tokens_mean'] or 0:.0f} tok "
            f"({cached} cached), output {s['output_tokens_mean'] or 0:.0f} tok, "
            f"TTFT p50 {fmt_s(s['ttft_p50_s'])} p95 {fmt_s(s['ttft_p95_s'])}, TPOT {fmt_s(s['tpot_mean_s'])}, "
            f"{s['output_tokens_per_s']:.0f} output tok/s"
        )
        if s["first_error"]:
            text += f"; first error: {s['first_error']}"
        return text

    def progress(self, elapsed_s: float, phase_s: float, in_flight: int) -> str:
        """The progress bar, redrawn in place while the phase runs."""
        frac = min(max(elapsed_s / phase_s, 0.0), 1.0) if phase_s > 0 else 1.0
        filled = int(round(frac * BAR_WIDTH))
        ok = self.ok
        completion = sum(r.completion_tokens for r in ok)
        ttft = percentile([r.ttft_s for r in ok if r.ttft_s is not None], 50)
        return (
            f"phase {self.number} {self.kind.label:<13} [{'#' * filled}{'.' * (BAR_WIDTH - filled)}] "
            f"{elapsed_s:4.0f}/{phase_s:.0f} s  done {len(self.results)} (err {self.errors})  "
            f"in flight {in_flight}  {completion / elapsed_s if elapsed_s > 0 else 0:5.0f} tok/s  "
            f"TTFT p50 {fmt_s(ttft)}"
        )


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
