"""What `evolving-infra up` prints once the cluster is up (pure: facts in, text out)."""

from __future__ import annotations

from dataclasses import dataclass

SNIPPET = """\
from openai import OpenAI
client = OpenAI(base_url="{url}/v1", api_key="{key}")
r = client.chat.completions.create(model="{model}", messages=[{{"role": "user", "content": "Hello!"}}],
                                   max_tokens=32,
                                   # one agent branch of one turn: finished with this request
                                   extra_headers={{"X-Branch-ID": "my-agent", "X-Branch-Finished": "true"}})
print(r.choices[0].message.content, r.usage)"""

MODE_MEANING = {
    "auto": "moves the split itself",
    "advisory": "records what it would do, switches nothing",
    "manual": "only predicts; operators switch nodes",
}


@dataclass(frozen=True)
class StartupFacts:
    gateway_url: str
    console_url: str | None  # None: no console (--no-console, or it failed: console_problem)
    store: str
    auth: str
    planner: str
    mode: str
    mode_persisted: bool  # an operator's choice kept in the store beat the start setting
    requested_mode: str  # --planner-mode / EVOLVING_PLANNER_MODE
    model: str
    key: str | None
    key_file: str
    key_problem: str | None = None
    console_problem: str | None = None
    load: str | None = None  # how the built-in load runs, or None


def planner_line(f: StartupFacts) -> str:
    if f.planner == "none":
        return "planner:  none (EVOLVING_PLANNER=none): the split moves only by hand"
    text = f"planner:  {f.planner}, mode {f.mode} ({MODE_MEANING.get(f.mode, '?')})"
    if f.mode_persisted and f.mode != f.requested_mode:
        text += (
            f"\n          an operator set this mode earlier and it is kept in the store; it wins over "
            f"--planner-mode {f.requested_mode}. Change it on the console's Planner page "
            "(or PUT /admin/planner/mode)"
        )
    return text


def startup_text(f: StartupFacts, admin_notice: str) -> str:
    lines = []
    if f.console_url:
        lines.append(f"console:  {f.console_url}")
    elif f.console_problem:
        lines.append(f"console:  NOT RUNNING — {f.console_problem}")
    lines.append(f"gateway:  {f.gateway_url}/v1   (metrics {f.gateway_url}/metrics, admin API {f.gateway_url}/admin)")
    lines.append(f"store:    {f.store}   auth: {f.auth}")
    lines.append(planner_line(f))
    lines.append(admin_notice)
    if f.auth == "keys":
        if f.key is None:
            lines.append(f"demo key: NONE — {f.key_problem}")
            lines.append(
                "try it (with a key of yours):\n" + SNIPPET.format(url=f.gateway_url, key="<API key>", model=f.model)
            )
        else:
            lines.append(f"demo tenant API key in {f.key_file} (checked against the store)")
            lines.append("try it:\n" + SNIPPET.format(url=f.gateway_url, key=f.key, model=f.model))
    else:
        lines.append(
            "try it (auth is open: any key works):\n" + SNIPPET.format(url=f.gateway_url, key="sk-local", model=f.model)
        )
    if f.load:
        lines.append(f"load:     {f.load}")
    return "\n".join(lines)
