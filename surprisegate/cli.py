"""Command line: `surprisegate ask | demo | memory | receipts | bench | config`.

User mistakes (`SurpriseGateError`) become one-line messages and non-zero exit codes, never tracebacks.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from . import __version__
from .config import Config, ConfigLayers, flag_fields, to_toml
from .errors import BackendError, InputError, SurpriseGateError
from .paths import home
from .runtime import assemble, check_memory
from .terminal import TerminalView

DEMO_QUESTION = "What is the capital of Burkina Faso?"
DEMO_PARAGRAPH = (
    "Write a short paragraph about Chad: its capital, currency, official languages and neighbouring countries."
)
DEMO_PARAGRAPH_TOKENS = 160


def _say(message: str) -> None:
    click.echo(message, err=True)


class Group(click.Group):
    """Turns our errors (and llama.cpp load failures we already wrapped) into clean exits."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except SurpriseGateError as err:
            click.echo(f"error: {err}", err=True)
            ctx.exit(err.exit_code)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            ctx.exit(130)
        except (click.exceptions.Exit, click.ClickException, click.exceptions.Abort):
            raise
        except Exception as err:  # a bug, not a user mistake: short message, traceback on request
            if os.environ.get("SURPRISEGATE_DEBUG") == "1":
                raise
            click.echo(
                f"internal error: {type(err).__name__}: {err} (set SURPRISEGATE_DEBUG=1 for the traceback "
                "and please report it)",
                err=True,
            )
            ctx.exit(70)


@click.group(cls=Group)
@click.version_option(__version__, prog_name="surprisegate")
def main() -> None:
    """Surprise-gated decoding: ground a model mid-reply only where its own surprise says it is unsure."""


# ---------------------------------------------------------------------------------------------
# shared options
# ---------------------------------------------------------------------------------------------
def _number(kind):
    def convert(ctx, param, value):
        if value is None:
            return None
        try:
            return kind(value)
        except ValueError:
            raise InputError(
                f"--{param.name.replace('_', '-')}={value!r} is not a {'whole number' if kind is int else 'number'}; "
                f"pass e.g. --{param.name.replace('_', '-')} {'16' if kind is int else '2.5'}"
            ) from None

    return convert


_CONVERT = {int: _number(int), float: _number(float)}


def config_options(f):
    """The Config fields marked as flags (config.flag_fields: name, flag, type and help live there once)."""
    opts = [click.option("--config", "config_file", type=click.Path(dir_okay=False), help="TOML config file.")]
    for name, flag, kind, help_text in flag_fields():
        opts.append(
            click.option(
                flag,
                name,
                callback=_CONVERT.get(kind),
                metavar={int: "N", float: "NUMBER"}.get(kind, "TEXT"),
                help=help_text + ".",
            )
        )
    for opt in reversed(opts):
        f = opt(f)
    return f


CONFIG_KEYS = tuple(name for name, *_ in flag_fields())


def resolve_layers(kwargs: dict) -> ConfigLayers:
    """The flags and --config file of a command (its config options, taken out of kwargs), with the environment."""
    overrides = {k: kwargs.pop(k) for k in CONFIG_KEYS if k in kwargs}
    return ConfigLayers(kwargs.pop("config_file", None), overrides)


def resolve_config(kwargs: dict) -> Config:
    """The config before a model is loaded (no per-model calibration: runtime.model_config adds it)."""
    return resolve_layers(kwargs).load()


# ---------------------------------------------------------------------------------------------
# ask
# ---------------------------------------------------------------------------------------------
@main.command()
@click.argument("question", required=False, default="")
@config_options
@click.option(
    "--memory",
    default="demo",
    show_default=True,
    help="Memory store (SQLite file); 'demo' = built-in demo knowledge base; 'none' = no memory arm.",
)
@click.option("--no-tools", is_flag=True, help="Disable the tool arm.")
@click.option(
    "--web",
    "web_url",
    default=None,
    help="Web arm: a SearxNG-compatible URL, or brave | tavily | wikipedia (keys from env).",
)
@click.option(
    "--receipts",
    "receipts_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Receipts JSONL file [default: $SURPRISEGATE_HOME/receipts.jsonl].",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of streaming.")
@click.option(
    "--chat",
    "chat_file",
    type=click.Path(dir_okay=False, allow_dash=True),
    default=None,
    help='A conversation to continue instead of QUESTION: a JSON list of {"role", "content"} turns '
    "ending with the user's (- reads standard input).",
)
@click.option(
    "--format",
    "reply_format",
    default=None,
    metavar="json|SCHEMA.json",
    help="Write the reply as JSON under a grammar, the gate inside it: 'json' for any object, or a JSON schema "
    "file the reply must match (in process, llama.cpp).",
)
def ask(
    question: str,
    memory: str,
    no_tools: bool,
    web_url: str | None,
    receipts_path: str | None,
    as_json: bool,
    chat_file: str | None,
    reply_format: str | None,
    **kwargs,
) -> None:
    """Answer QUESTION (or the last turn of a --chat), streaming the reply and showing any intervention."""
    from .gate.prompting import conversation, last_user_turn
    from .gate.receipts import ReceiptWriter

    # Validated before anything slow happens.
    messages = conversation(read_chat(chat_file) if chat_file else question)
    question = last_user_turn(messages)
    output = reply_format_of(reply_format)
    # The model's calibration applies (detect only without one); a store is opened only to intervene.
    runtime = assemble(resolve_layers(kwargs), memory, not no_tools, web_url, _say, arms_if_intervening=True)
    config = runtime.config
    receipts_file = Path(receipts_path) if receipts_path else home() / "receipts.jsonl"
    view = None if as_json else TerminalView(color=sys.stdout.isatty())
    if view:
        click.echo(view.paint(f"[{config.mode}] ", "2") + question.strip())
    result = runtime.generate(messages, on_event=view, output=output)
    ReceiptWriter(receipts_file).append(result.receipt)
    if view is None:  # --json
        click.echo(
            json.dumps(
                {
                    "reply": result.text,
                    "mode": config.mode,
                    "rounds": result.rounds,
                    "finish_reason": result.finish_reason,
                    "n_tokens": result.n_tokens,
                    "surprise": result.receipt.get("surprise"),
                    "canary": result.receipt.get("canary"),
                    "receipt": str(receipts_file),
                    "receipt_id": result.receipt.get("reply_id"),
                    "fault": result.receipt.get("fault"),
                },
                ensure_ascii=False,
            )
        )
    else:
        click.echo(view.paint(f"receipt → {receipts_file}", "2"), err=True)
    _raise_fault(result.receipt)


def reply_format_of(value: str | None):
    """`--format`: None, any JSON object ("json"), or the JSON schema in a file; checked before the model loads."""
    from .gate.structured import ResponseFormat

    if value is None:
        return None
    if value == "json":
        return ResponseFormat("json_object")
    path = Path(value)
    try:
        schema = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise InputError(
            f"--format={value!r}: not 'json' nor a readable JSON schema file ({err}); fix the path"
        ) from None
    if not isinstance(schema, dict):
        raise InputError(f"--format={value!r}: the file holds {type(schema).__name__}, not a JSON schema object")
    output = ResponseFormat("json_schema", schema, path.stem)
    output.gbnf()  # a schema llama.cpp's converter cannot take fails here, before the model loads
    return output


def _raise_fault(receipt: dict) -> None:
    """A reply the backend broke off was printed and its receipt written: now say so, with exit code 3."""
    fault = receipt.get("fault")
    if fault:
        raise BackendError(
            f"the reply ended early after {fault.get('at_token')} tokens: {fault.get('message')} "
            f"(what arrived is kept, receipt {receipt.get('reply_id')})"
        )


def read_chat(path: str) -> list:
    """A conversation from a JSON file (or - for standard input)."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise InputError(f"--chat={path!r} cannot be read ({err.strerror or err}); pass a JSON file of turns") from None
    try:
        chat = json.loads(text)
    except json.JSONDecodeError as err:
        raise InputError(
            f"--chat={path!r} is not JSON ({err.msg} at line {err.lineno}); pass a list of "
            '{"role": "user", "content": "..."} turns'
        ) from None
    return chat


# ---------------------------------------------------------------------------------------------
# demo
# ---------------------------------------------------------------------------------------------
@main.command()
@click.option("--question", default=DEMO_QUESTION, show_default=True)
@click.option("--paragraph", default=DEMO_PARAGRAPH, show_default=True, help="A paragraph prompt ('' skips it).")
@click.option("--receipts", "receipts_path", type=click.Path(dir_okay=False), default=None)
def demo(question: str, paragraph: str, receipts_path: str | None) -> None:
    """The main job on the embedded default: the same question plain, then surprise-gated with memory; then
    a paragraph the same way (160 tokens: every sentence judged on its own claim)."""
    from .gate.receipts import ReceiptWriter

    receipts_file = Path(receipts_path) if receipts_path else home() / "demo-receipts.jsonl"
    loading = "loading the embedded model (SmolLM2-135M-Instruct, llama.cpp) ..."
    runtime = assemble(ConfigLayers(), "demo", say=_say, intervene=True, loading=loading)
    base, detect_only = runtime.config, runtime.thresholds is not None and runtime.thresholds.detect_only
    writer = ReceiptWriter(receipts_file)
    runs = [(question, base)] + ([(paragraph, base.replace(max_tokens=DEMO_PARAGRAPH_TOKENS))] if paragraph else [])
    for asked, config in runs:
        _demo_pair(runtime, asked, config, detect_only, writer)
    click.echo(f"receipts → {receipts_file}  (surprisegate receipts show {receipts_file})")


def _demo_pair(runtime, question: str, base, detect_only: bool, writer) -> None:
    """One prompt plain, then gated, streamed as it is written; then both replies and the gated one's rounds."""
    outcomes = {}
    for mode in ("off", "intervene"):
        # A model the environment chose, with no calibration: its second pass only detects (said above).
        config = base.replace(mode="detect" if mode == "intervene" and detect_only else mode)
        view = TerminalView(color=sys.stdout.isatty())
        click.echo(view.paint(f"\n── mode={mode} ──", "1"))
        click.echo(f"Q: {question}\nA: ", nl=False)
        result = runtime.generate(question, config, on_event=view)
        writer.append(result.receipt)
        outcomes[mode] = result
    click.echo("\n── summary ──")
    click.echo(f"off:       {outcomes['off'].text}")
    click.echo(f"intervene: {outcomes['intervene'].text}")
    for r in outcomes["intervene"].rounds:
        chosen = r.get("chosen") or {}
        doubted = (r.get("trigger") or {}).get("span_text", "").strip()
        click.echo(
            f"round {r['round']}: {r['action']} — {r['reason']}; doubted: {doubted[:60]!r}; "
            f"evidence: {chosen.get('evidence')!r}"
        )


# ---------------------------------------------------------------------------------------------
# memory
# ---------------------------------------------------------------------------------------------
@main.group()
def memory() -> None:
    """Build and query a memory store (one SQLite file, FTS5 BM25)."""


@memory.command("add")
@click.option("--memory", "memory_path", required=True, help="Store: SQLite file (created if absent) or milvus URI.")
@click.option("--text-field", default="text", show_default=True)
@click.option("--id-field", default="kb_id", show_default=True)
@click.option("--title-field", default="title", show_default=True)
@click.argument("files", nargs=-1, required=True)
def memory_add(memory_path: str, text_field: str, id_field: str, title_field: str, files: tuple[str, ...]) -> None:
    """Ingest JSONL files (one passage per line) and .txt/.md files or folders."""
    from .store.open import open_memory

    for f in files:
        if not Path(f).exists():
            raise InputError(f"FILE={f!r} does not exist; pass JSONL, .txt or .md files or folders to ingest")
    with open_memory(memory_path, create=True) as store:
        for f in files:
            p = Path(f)
            click.echo(f"{f}: ingesting ...", err=True)
            if p.is_file() and p.suffix in (".jsonl", ".json", ".ndjson"):
                report = store.add_jsonl(p, text_field=text_field, id_field=id_field, title_field=title_field)
            else:
                report = store.add_text_files([p])
            embedded = getattr(report, "embedded", None)
            click.echo(
                f"{f}: added {report.added}, duplicates skipped {report.skipped_duplicates}, "
                f"errors {len(report.errors)}" + (f", vectors {embedded}" if embedded is not None else "")
            )
            for line_no, message in report.errors[:20]:
                click.echo(f"  line {line_no}: {message}", err=True)
        click.echo(f"{memory_path}: {store.count()} passages")


@memory.command("search")
@click.option("--memory", "memory_path", required=True)
@click.option("-k", "k", default=5, show_default=True, type=int)
@click.option(
    "--mode",
    "search_mode",
    type=click.Choice(["hybrid", "bm25", "dense"]),
    default=None,
    help="Search mode [default: the store's, hybrid].",
)
@click.option("--json", "as_json", is_flag=True)
@click.argument("query")
def memory_search(memory_path: str, k: int, search_mode: str | None, as_json: bool, query: str) -> None:
    """Search the store; best first, with normalised relevance (0..1) and source."""
    from .store.open import open_memory

    check_memory(memory_path)
    with open_memory(memory_path) as store:
        hits = store.search(query, k=k, mode=search_mode) if search_mode else store.search(query, k=k)
    if as_json:
        click.echo(
            json.dumps(
                [{"text": h.text, "score": round(h.score, 4), "source": h.source, "title": h.title} for h in hits],
                ensure_ascii=False,
            )
        )
        return
    if not hits:
        click.echo("no hits")
    for i, h in enumerate(hits, 1):
        click.echo(f"{i}. [{h.score:.2f}] {h.source} — {h.text[:160]}")


@memory.command("stats")
@click.option("--memory", "memory_path", required=True)
@click.option("--json", "as_json", is_flag=True)
def memory_stats(memory_path: str, as_json: bool) -> None:
    """Passages, sources, embedder, index sizes."""
    from .store.open import open_memory

    check_memory(memory_path)
    with open_memory(memory_path) as store:
        stats = store.stats()
    click.echo(json.dumps(stats, default=str) if as_json else "\n".join(f"{k:>16}: {v}" for k, v in stats.items()))


@memory.command("remove")
@click.option("--memory", "memory_path", required=True)
@click.argument("source_prefix")
def memory_remove(memory_path: str, source_prefix: str) -> None:
    """Remove every passage whose source starts with SOURCE_PREFIX (from every index, in one transaction)."""
    from .store.open import open_memory

    check_memory(memory_path)
    with open_memory(memory_path) as store:
        removed = store.remove(source_prefix)
        click.echo(f"removed {removed} passages; {store.count()} left")


@memory.command("reindex")
@click.option("--memory", "memory_path", required=True)
@click.option("--full", is_flag=True, help="Recompute every vector and rebuild the full-text index.")
def memory_reindex(memory_path: str, full: bool) -> None:
    """Fill in missing vectors (e.g. a store built before dense search existed)."""
    from .store.open import open_memory

    check_memory(memory_path)
    with open_memory(memory_path) as store:
        click.echo(f"embedded {store.reindex(full=full)} passages")


# ---------------------------------------------------------------------------------------------
# receipts
# ---------------------------------------------------------------------------------------------
@main.group()
def receipts() -> None:
    """Read receipts (JSON Lines, one object per reply)."""


@receipts.command("show")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--last", type=int, default=None, help="Only the last N receipts.")
def receipts_show(file: str, last: int | None) -> None:
    """Print receipts readably; a torn last line is skipped with a note."""
    from .gate.receipts import format_receipt, read_receipts

    result = read_receipts(file)
    records = list(result)
    if last:
        records = records[-last:]
    color = sys.stdout.isatty()
    for rec in records:
        click.echo(format_receipt(rec, color=color))
        click.echo()
    skipped = getattr(result, "skipped_lines", [])
    if skipped:
        click.echo(f"note: skipped unreadable line(s) {', '.join(map(str, skipped))} (torn write?)", err=True)


@receipts.command("view")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--id", "reply_id", default=None, help="Only the reply whose reply_id starts with this.")
@click.option("--html", "out", required=True, type=click.Path(dir_okay=False), help="The HTML page to write.")
def receipts_view(file: str, reply_id: str | None, out: str) -> None:
    """Write a self-contained HTML page of the replies: tokens coloured by surprise, each round's doubted span,
    evidence and rewrite, and a plot of surprise with its threshold. It loads nothing from anywhere."""
    from .gate.receipts import read_receipts
    from .receipt_view import render_page

    records = list(read_receipts(file))
    if reply_id is not None:
        records = [r for r in records if str(r.get("reply_id", "")).startswith(reply_id)]
        if not records:
            raise InputError(f"--id={reply_id!r} matches no reply in {file!r}; `surprisegate receipts show` lists them")
    Path(out).write_text(render_page(records), encoding="utf-8")
    click.echo(f"{len(records)} repl{'y' if len(records) == 1 else 'ies'} → {out}")


# ---------------------------------------------------------------------------------------------
# label / calibrate / eval
# ---------------------------------------------------------------------------------------------
@main.command()
@click.option("--data", required=True, type=click.Path(dir_okay=False), help="JSONL items (question, answers).")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Output folder (resumable).")
@click.option("--limit", type=int, default=None, help="Only the first N items.")
@config_options
def label(data: str, out_dir: str, limit: int | None, **kwargs) -> None:
    """Run the model in detect mode over QA items, grade each reply, keep per-token signals and top-20 logprobs
    (resumable)."""
    from .progress import progress_callback
    from .research.labeling import label as run_label
    from .research.labeling import read_items

    read_items(data, 1)  # fail fast on a bad file before loading the model
    runtime = assemble(resolve_config(kwargs), tools=False)  # detect mode over the items: no arms
    with progress_callback("label") as progress:
        summary = run_label(data, out_dir, runtime.backend, runtime.config, limit=limit, progress=progress)
    click.echo(json.dumps(summary))


@main.command()
@click.option(
    "--backend",
    "backend_spec",
    default=None,
    help="Calibrate this model: label the packaged calibration set (400 graded dev items) through it, e.g. "
    "llama-server://127.0.0.1:8080, llamacpp or openai, and write its calibration where ask, eval and demo "
    "find it.",
)
@click.option("--model", default=None, help="With --backend: the model, as for ask (GGUF path, served name).")
@click.option(
    "--base-url",
    default=None,
    help="With a chat API --backend: its endpoint, e.g. an OpenAI-compatible server's http://HOST:PORT/v1.",
)
@click.option("--limit", type=int, default=None, help="With --backend: only the first N items of the set.")
@click.option(
    "--labels",
    "label_dirs",
    multiple=True,
    type=click.Path(),
    help="Instead of --backend: folder(s) written by `surprisegate label` (repeatable: pooled).",
)
@click.option(
    "--out",
    "out_config",
    default=None,
    type=click.Path(dir_okay=False),
    help="Config TOML to write (with --compare-top-k: the JSON summary); needed with --labels. With --backend "
    "[default: $SURPRISEGATE_HOME/calibrations/MODEL--SIGNALS.toml, where it is picked up].",
)
@click.option("--bootstrap", default=500, show_default=True, type=int, help="Bootstrap resamples for AUROC CIs.")
@click.option(
    "--objective",
    type=click.Choice(["precision", "recall"]),
    default=None,
    help="precision: highest precision at recall >= 0.5; recall: most wrong replies caught at precision "
    ">= --min-precision (and recall >= 0.5), what the shipped defaults use (see README Results). "
    "[default: recall with --backend, precision with --labels]",
)
@click.option("--min-precision", default=0.90, show_default=True, type=float)
@click.option(
    "--top-k",
    callback=_number(int),
    metavar="K",
    help="With --labels: compute the signals from the top K (1-20) logprobs only, as a server or API streams "
    "them: surprise stays exact, entropy is estimated. Default: full distribution.",
)
@click.option(
    "--compare-top-k",
    default=None,
    metavar="K,K,...",
    help="e.g. 20,8,5: instead of calibrating, write the shipped rule's AUROC on the full entropy vs each "
    "top-K estimate to --out (JSON) and a .md table beside it.",
)
@click.option("--json", "as_json", is_flag=True)
def calibrate(
    backend_spec: str | None,
    model: str | None,
    base_url: str | None,
    limit: int | None,
    label_dirs: tuple[str, ...],
    out_config: str | None,
    bootstrap: int,
    objective: str | None,
    min_precision: float,
    top_k: int | None,
    compare_top_k: str | None,
    as_json: bool,
) -> None:
    """A model's own thresholds: AUROC of each signal, sweep of trigger rules, chosen operating point written
    to a config, plots. `--backend URI` labels the packaged set through that model first."""
    check_calibrate_options(backend_spec, model, limit, label_dirs, out_config, top_k, compare_top_k, base_url)
    if backend_spec:
        calibrate_backend(
            backend_spec, model, base_url, limit, out_config, bootstrap, objective or "recall", min_precision, as_json
        )
        return
    assert out_config is not None  # check_calibrate_options: --labels needs --out
    calibrate_labels(
        label_dirs, out_config, bootstrap, objective or "precision", min_precision, top_k, compare_top_k, as_json
    )


def check_calibrate_options(
    backend_spec: str | None,
    model: str | None,
    limit: int | None,
    label_dirs: tuple[str, ...],
    out_config: str | None,
    top_k: int | None,
    compare_top_k: str | None,
    base_url: str | None = None,
) -> None:
    """The two ways to calibrate (--backend, --labels) and the options each takes, before anything loads."""
    if backend_spec and label_dirs:
        raise InputError(
            f"--backend={backend_spec!r} and --labels={label_dirs[0]!r} are two ways to calibrate; pass one "
            "(--backend labels the packaged set through that model, --labels uses labels you made)"
        )
    if not backend_spec and not label_dirs:
        raise InputError(
            "calibrate needs --backend URI (label the packaged calibration set through that model, e.g. "
            "--backend llama-server://127.0.0.1:8080) or --labels DIR (written by `surprisegate label`)"
        )
    if label_dirs:
        given = (("--model", model), ("--base-url", base_url), ("--limit", limit))
        extra = [f"{name}={value!r}" for name, value in given if value is not None]
        if extra:
            raise InputError(f"{', '.join(extra)} go with --backend; drop them, or pass --backend URI for --labels")
        if out_config is None:
            raise InputError("--out is needed with --labels; pass e.g. --out mine.toml")
        return
    if top_k is not None or compare_top_k is not None:
        name, value = ("--top-k", top_k) if top_k is not None else ("--compare-top-k", compare_top_k)
        raise InputError(
            f"{name}={value!r} goes with --labels: with --backend the backend sets where the signals come from "
            "(a server's top 20, the full distribution in process); drop it"
        )
    if limit is not None and limit < 1:
        raise InputError(f"--limit={limit!r} must be a whole number >= 1, e.g. --limit 40 (or drop it: all 400)")


def calibrate_backend(
    backend_spec: str,
    model: str | None,
    base_url: str | None,
    limit: int | None,
    out_config: str | None,
    bootstrap: int,
    objective: str,
    min_precision: float,
    as_json: bool,
) -> None:
    """`calibrate --backend`: label the packaged set through the model, calibrate, write its calibration."""
    from . import model_calibrations
    from .progress import progress_callback
    from .research.calibration_report import model_calibration_lines
    from .research.model_calibration import calibrate_model

    given = {"backend": backend_spec, "model": model} | ({"base_url": base_url} if base_url else {})
    runtime = assemble(ConfigLayers(None, given).load(), tools=False)  # labels the set in detect mode: no arms
    backend = runtime.backend
    with (
        progress_callback("label") as label_progress,
        progress_callback("label probe questions") as probe_label_progress,
        progress_callback("probe") as probe_progress,
    ):
        result = calibrate_model(
            backend,
            runtime.config,
            out=out_config,
            limit=limit,
            objective=objective,
            min_precision=min_precision,
            bootstrap=bootstrap,
            progress=_say,
            label_progress=label_progress,
            probe_label_progress=probe_label_progress,
            probe_progress=probe_progress,
        )
    if as_json:
        click.echo(json.dumps({k: v for k, v in result.items() if k != "report"} | {"config": result["calibration"]}))
        return
    signals = model_calibrations.source_label(model_calibrations.backend_top_k(backend))
    user_file = model_calibrations.user_dir(home()) / f"{result['slug']}.toml"
    flags = f"{f' --model {model}' if model else ''}{f' --base-url {base_url}' if base_url else ''}"
    ask_hint = f'surprisegate ask --backend {backend_spec}{flags} --mode intervene "QUESTION"'
    for line in model_calibration_lines(result, objective, signals, user_file, ask_hint, out_config):
        click.echo(line)


def calibrate_labels(
    label_dirs: tuple[str, ...],
    out_config: str,
    bootstrap: int,
    objective: str,
    min_precision: float,
    top_k: int | None,
    compare_top_k: str | None,
    as_json: bool,
) -> None:
    """`calibrate --labels`: the report on labels made by `surprisegate label`, its config to --out."""
    from .research.calibration_report import labels_report_lines
    from .research.threshold_sweep import calibrate as run
    from .research.threshold_sweep import write_topk_comparison

    if compare_top_k is not None:
        try:
            ks = [int(k) for k in compare_top_k.split(",")]
        except ValueError:
            raise InputError(
                f"--compare-top-k={compare_top_k!r} is not a comma list of whole numbers; "
                "pass e.g. --compare-top-k 20,8,5"
            ) from None
        summary = write_topk_comparison(
            list(label_dirs), out_config, ks, bootstrap=bootstrap, progress=lambda m: click.echo(m, err=True)
        )
        click.echo(json.dumps(summary) if as_json else Path(summary["markdown"]).read_text())
        return
    report = run(
        list(label_dirs),
        out_config,
        bootstrap=bootstrap,
        objective=objective,
        min_precision=min_precision,
        progress=lambda m: click.echo(m, err=True),
        top_k=top_k,
    )
    if as_json:
        click.echo(json.dumps({k: v for k, v in report.items() if k != "auroc_table"}))
        return
    for line in labels_report_lines(report, top_k):
        click.echo(line)


@main.command("eval")
@click.option("--data", required=True, type=click.Path(dir_okay=False))
@click.option(
    "--modes",
    default="off,detect,intervene",
    show_default=True,
    help="Comma list of off,detect,intervene,always,flare,oracle and the peers dragin,etc,etc-trend,seakr,"
    "entropy-rule,single-retrieval,fix-length-retrieval,fix-sentence-retrieval (oracle: ground exactly the items "
    "off got wrong, as many as intervene grounded or --oracle-calls; needs off; the peers need --backend "
    "transformers).",
)
@click.option(
    "--memory", default="none", show_default=True, help="Memory store for the memory arm ('none' = no memory)."
)
@click.option("--web", "web_url", default=None, help="SearxNG-compatible search URL for the web arm.")
@click.option("--no-tools", is_flag=True)
@click.option("--limit", type=int, default=None, help="Only the first N items.")
@click.option("--sample", type=int, default=None, help="A seeded random subset of N items (after --limit).")
@click.option("--out", "out_dir", default="eval-out", show_default=True, type=click.Path(file_okay=False))
@click.option(
    "--flare-theta",
    default=0.4,
    show_default=True,
    type=float,
    help="FLARE baseline: a look-ahead token with probability at or below this triggers retrieval.",
)
@click.option(
    "--flare-mask-below",
    type=float,
    default=None,
    help="FLARE's query masks look-ahead tokens of probability at or below this (their configs: 0.4, with "
    "--flare-theta 0.8); default: mask at --flare-theta, the reading of the README's earlier flare rows.",
)
@click.option(
    "--flare-pre-retrieval",
    is_flag=True,
    help="FLARE retrieves with the question before the first sentence, as their configs do.",
)
@click.option(
    "--oracle-calls",
    type=int,
    default=None,
    help="Replies the oracle may ground (default: as many as intervene grounded in this run).",
)
@click.option(
    "--peer-threshold",
    "peer_threshold",
    multiple=True,
    help="A peer's trigger threshold, NAME=VALUE (repeatable), e.g. dragin=0.8; default: their configs' values.",
)
@click.option(
    "--peer-passages",
    type=int,
    default=3,
    show_default=True,
    help="Passages a peer's retrieval puts in its prompt, 1-3 (their configs: 3; the gate injects one).",
)
@click.option("--json", "as_json", is_flag=True)
@config_options
def eval_cmd(
    data: str,
    modes: str,
    memory: str,
    web_url: str | None,
    no_tools: bool,
    limit: int | None,
    sample: int | None,
    out_dir: str,
    flare_theta: float,
    flare_mask_below: float | None,
    flare_pre_retrieval: bool,
    oracle_calls: int | None,
    peer_threshold: tuple[str, ...],
    peer_passages: int,
    as_json: bool,
    **kwargs,
) -> None:
    """The A/B: accuracy, regressions, trigger rate, grounding calls, tokens and time per mode."""
    from .progress import progress_callback
    from .research.evaluate import FlareSettings, check_modes, evaluate
    from .research.labeling import read_items
    from .research.peers.modes import check_passages, parse_thresholds

    read_items(data, 1)
    peer_thresholds = parse_thresholds(peer_threshold)
    check_passages(peer_passages)
    mode_list = [m.strip() for m in modes.split(",") if m.strip()]
    flare = FlareSettings(flare_theta, flare_mask_below, flare_pre_retrieval)
    check_modes(mode_list, flare, oracle_calls)  # before the model loads
    runtime = assemble(resolve_layers(kwargs), memory, not no_tools, web_url, _say, intervene=False)
    config, thresholds = runtime.config, runtime.thresholds
    gated = [m for m in mode_list if m in ("intervene", "oracle")]
    if thresholds is not None and thresholds.detect_only and gated:
        # An A/B of intervene on another model's thresholds measures nothing: refuse rather than run detect.
        raise InputError(
            f"--modes={modes!r}: {', '.join(gated)} needs thresholds for {thresholds.model_id}, which has no "
            f"calibration; calibrate with: surprisegate calibrate --backend {config.backend}"
            + (f" --model {config.model}" if config.model else "")
            + ", or pass --threshold / --config with thresholds"
        )
    with progress_callback("eval") as progress:
        summary = evaluate(
            data,
            mode_list,
            runtime.backend,
            config,
            runtime.arms,
            out_dir,
            limit=limit,
            sample=sample,
            progress=progress,
            flare=flare,
            oracle_calls=oracle_calls,
            peer_thresholds=peer_thresholds,
            peer_passages=peer_passages,
        )
    if as_json:
        click.echo(json.dumps(summary))
    else:
        click.echo((Path(out_dir) / "report.md").read_text())


@main.command("websearch-serve", context_settings={"ignore_unknown_options": True})
@click.option("--corpus", required=True, type=click.Path(dir_okay=False), help="JSONL documents (doc_id, text).")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8888, show_default=True, type=int)
@click.option("--quiet", is_flag=True)
def websearch_serve(corpus: str, host: str, port: int, quiet: bool) -> None:
    """A local SearxNG-compatible search server (BM25 over a JSONL corpus) for tests and evaluation."""
    from .local.search_server import main as serve_main

    if not Path(corpus).is_file():
        raise InputError(f"--corpus={corpus!r} does not exist; pass a JSONL file with doc_id and text fields")
    args = ["--corpus", corpus, "--host", host, "--port", str(port)] + (["--quiet"] if quiet else [])
    raise SystemExit(serve_main(args) or 0)


# ---------------------------------------------------------------------------------------------
# config
# ---------------------------------------------------------------------------------------------
@main.command("config")
@config_options
def config_cmd(**kwargs) -> None:
    """Print the effective config (flags > file > env > defaults) as TOML."""
    click.echo(to_toml(resolve_config(kwargs)), nl=False)


# ---------------------------------------------------------------------------------------------
# bench
# ---------------------------------------------------------------------------------------------
@main.group()
def bench() -> None:
    """Benchmarks that print ratios against a baseline measured in the same run."""


@bench.command("decode")
@click.option("--tokens", default=64, show_default=True, type=int, help="Tokens per run: short runs, many of them.")
@click.option("--repeats", default=40, show_default=True, type=int, help="Interleaved repeats of each arm.")
@click.option(
    "--paragraph", is_flag=True, help="A paragraph prompt in sentence scope (every sentence judged); use --tokens 160."
)
@click.option("--json", "as_json", is_flag=True)
def bench_decode(tokens: int, repeats: int, paragraph: bool, as_json: bool) -> None:
    """detect-mode tokens/s ÷ plain llama-cpp-python greedy tokens/s, same model and prompt, with 95% intervals."""
    from .research.bench import bench_decode as run

    out = run(n_tokens=tokens, repeats=repeats, progress=lambda m: click.echo(m, err=True), paragraph=paragraph)
    click.echo(json.dumps(out) if as_json else _pretty(out))


@bench.command("rewind")
@click.option("--context", "context_tokens", default=1500, show_default=True, type=int)
@click.option("--repeats", default=5, show_default=True, type=int)
@click.option("--json", "as_json", is_flag=True)
def bench_rewind(context_tokens: int, repeats: int, as_json: bool) -> None:
    """(rewind 16 + inject 30 + re-decode 16) ÷ re-prefilling the whole context."""
    from .research.bench import bench_rewind as run

    out = run(context_tokens=context_tokens, repeats=repeats, progress=lambda m: click.echo(m, err=True))
    click.echo(json.dumps(out) if as_json else _pretty(out))


@bench.command("http")
@click.option("--backend", "backend_uri", default=None, help="A running llama-server://HOST:PORT (default: start one).")
@click.option("--context", "context_tokens", default=1500, show_default=True, type=int)
@click.option("--tokens", default=256, show_default=True, type=int)
@click.option("--repeats", default=5, show_default=True, type=int)
@click.option("--json", "as_json", is_flag=True)
def bench_http(backend_uri: str | None, context_tokens: int, tokens: int, repeats: int, as_json: bool) -> None:
    """Over llama-server: resume-after-rewind ÷ cold prompt ms (server timings), detect ÷ plain stream tokens/s."""
    from .research.bench import bench_http as run

    out = run(
        backend_uri=backend_uri,
        context_tokens=context_tokens,
        n_tokens=tokens,
        repeats=repeats,
        progress=lambda m: click.echo(m, err=True),
    )
    click.echo(json.dumps(out) if as_json else _pretty(out))


@bench.command("paragraph")
@click.option("--data", required=True, type=click.Path(dir_okay=False), help="Long-form prompts (JSONL, `question`).")
@click.option("--memory", default="demo", show_default=True, help="Memory store for the gated replies.")
@click.option("--prompts", default=20, show_default=True, type=int, help="A seeded sample of this many prompts.")
@click.option("--max-tokens", default=160, show_default=True, type=int)
@click.option("--model", default="", help="GGUF path; empty = embedded SmolLM2-135M.")
@click.option("--json", "as_json", is_flag=True)
def bench_paragraph_cmd(data: str, memory: str, prompts: int, max_tokens: int, model: str, as_json: bool) -> None:
    """The pause a reader sees: time to the first token and the longest gap between shown sentences, off
    against intervene on the same paragraph prompts; the extra gap a grounding round adds, split into the round's own
    overhead (goal p95 <= 150 ms) and its rewrite's decode."""
    import random

    from .progress import progress_callback
    from .research.bench_paragraph import bench_paragraph
    from .research.labeling import read_items

    items = read_items(data)
    chosen = random.Random(0).sample(items, min(prompts, len(items)))
    overrides = {"max_tokens": max_tokens} | ({"model": model} if model else {})
    runtime = assemble(ConfigLayers(None, overrides), memory, False, None, _say, intervene=True)
    with progress_callback("bench paragraph") as progress:
        out = bench_paragraph(
            runtime.backend, runtime.config, runtime.arms, [it["question"] for it in chosen], progress
        )
    out["model"] = runtime.backend.model_id
    click.echo(json.dumps(out) if as_json else _pretty(out))


@bench.command("memory")
@click.option("--passages", "n_passages", default=100_000, show_default=True, type=int)
@click.option("--queries", default=200, show_default=True, type=int)
@click.option("--milvus/--no-milvus", default=True, show_default=True, help="Also measure milvus-lite.")
@click.option("--json", "as_json", is_flag=True)
def bench_memory_cmd(n_passages: int, queries: int, milvus: bool, as_json: bool) -> None:
    """p50/p95/p99 query latency of the SQLite store (hybrid) at N synthetic passages, Milvus beside it."""
    from .research.bench_memory import bench_memory

    milvus_bench: Callable[..., dict] | None = None
    if milvus:
        try:
            import milvus_lite  # noqa: F401
            import pymilvus  # noqa: F401

            from .research.bench_milvus import bench_milvus_on as milvus_bench
        except ImportError:
            click.echo("milvus-lite not installed: pip install 'surprisegate[milvus]'; SQLite only", err=True)
    out = bench_memory(
        n_passages=n_passages, queries=queries, progress=lambda m: click.echo(m, err=True), milvus_bench=milvus_bench
    )
    click.echo(json.dumps(out, default=str) if as_json else _pretty(out))


# ---------------------------------------------------------------------------------------------
# serve
# ---------------------------------------------------------------------------------------------
def _serve_main():
    """serve.main, or the pip command that installs the `serve` extra."""
    from .errors import MissingDependency

    try:
        from .serve import main as serve_main
    except ImportError as err:
        raise MissingDependency(
            f"serve needs the serve extra ({err.name} is missing): pip install 'surprisegate[serve]'"
        ) from None
    return serve_main


@main.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (0.0.0.0: all).")
@click.option("--port", default=8000, show_default=True, type=int)
@config_options
@click.option("--memory", default="demo", show_default=True, help="Memory store, as for ask ('none' = no memory arm).")
@click.option("--no-tools", is_flag=True, help="Disable the tool arm.")
@click.option(
    "--web", "web_url", default=None, help="Web arm: a SearxNG-compatible URL, or brave | tavily | wikipedia."
)
@click.option(
    "--sessions",
    type=int,
    default=None,
    help="Replies written at once: sessions of the embedded model (decoded together), or requests sent to a "
    "server backend at once [default: 4].",
)
@click.option(
    "--queue", "queue_size", default=32, show_default=True, type=int, help="Requests that may wait; more get 429."
)
@click.option(
    "--receipts",
    "receipts_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Receipts JSONL file [default: $SURPRISEGATE_HOME/serve-receipts.jsonl]; it holds users' prompts.",
)
@click.option("--no-receipts", is_flag=True, help="Keep no receipts (each is still returned to its caller).")
@click.option(
    "--receipts-max-mb", default=64, show_default=True, type=int, help="Rotate the receipts file at this size."
)
@click.option("--served-model-name", default=None, help="The model id clients send [default: the model file's stem].")
@click.option(
    "--client-system",
    type=click.Choice(["append", "replace", "refuse"]),
    default="append",
    show_default=True,
    help="A client's system/developer turns: append (after the server's system prompt, in one system turn), "
    "replace (they stand instead of it) or refuse (400).",
)
@click.option(
    "--max-grounding-s",
    type=float,
    default=8.0,
    show_default=True,
    help="Grounding budget per request: a request's max_rounds x round_deadline_s over it gets a 400.",
)
@click.option(
    "--allow-python",
    is_flag=True,
    help="Let the tool arm run Python snippets from clients' own turns (off by default: code execution is the "
    "operator's decision); needs a sandbox that isolates them here (bubblewrap, or the namespace sandbox).",
)
@click.option(
    "--receipts-show-config",
    is_flag=True,
    help="Receipts sent to clients include the server's config (system prompt, tool roots, allow-lists, model "
    "path); by default they carry only the gate settings a request may set.",
)
@click.option(
    "--cors-origin",
    "cors_origins",
    multiple=True,
    help="A browser origin allowed to call the server (repeat for more, e.g. --cors-origin http://localhost:3000; "
    "'*' allows any); none by default, so browser pages elsewhere are blocked.",
)
@click.option(
    "--ui",
    is_flag=True,
    help="Also serve a chat page at / to watch replies stream with their surprise and rounds (plain HTML and "
    "JS from this server only).",
)
def serve(
    host: str,
    port: int,
    memory: str,
    no_tools: bool,
    web_url: str | None,
    sessions: int | None,
    queue_size: int,
    receipts_path: str | None,
    no_receipts: bool,
    receipts_max_mb: int,
    served_model_name: str | None,
    client_system: str,
    max_grounding_s: float,
    allow_python: bool,
    receipts_show_config: bool,
    cors_origins: tuple[str, ...],
    ui: bool,
    **kwargs,
) -> None:
    """An OpenAI-compatible server (/v1/chat/completions, /v1/completions) with the gate in the loop.

    Bearer auth when SURPRISEGATE_API_KEY is set; per-request gate settings in "surprisegate": {...}."""
    serve_main = _serve_main()
    options = serve_main.ServeOptions(
        host=host,
        port=port,
        memory=memory,
        tools=not no_tools,
        web=web_url,
        sessions=sessions,
        queue=queue_size,
        receipts=receipts_path,
        keep_receipts=not no_receipts,
        receipts_max_mb=receipts_max_mb,
        model_name=served_model_name,
        limits=serve_main.Limits(max_grounding_s=max_grounding_s, client_system=client_system),
        allow_python=allow_python,
        show_config=receipts_show_config,
        cors_origins=cors_origins,
        ui=ui,
    )
    serve_main.serve_forever(resolve_layers(kwargs), options, _say)


@bench.command("server")
@click.option("--clients", default=32, show_default=True, type=int, help="Concurrent clients.")
@click.option("--requests", "per_client", default=5, show_default=True, type=int, help="Requests per client.")
@click.option("--sessions", default=4, show_default=True, type=int)
@click.option("--queue", "queue_size", default=32, show_default=True, type=int)
@click.option("--json", "as_json", is_flag=True)
def bench_server_cmd(clients: int, per_client: int, sessions: int, queue_size: int, as_json: bool) -> None:
    """`serve` on a free loopback port under concurrent clients: answered, 429s, mixed replies, lost
    receipts, latency, gated ÷ plain latency and 8-client ÷ 1-client throughput."""
    from .research.bench_server import bench_server

    _serve_main()  # the server it starts needs the serve extra: say so before starting it
    out = bench_server(clients=clients, per_client=per_client, sessions=sessions, queue=queue_size, progress=_say)
    click.echo(json.dumps(out) if as_json else _pretty(out))


def _pretty(d: dict) -> str:
    return "\n".join(f"{k:>28}: {v}" for k, v in d.items())


if __name__ == "__main__":
    main()
