"""The Dagster UI's own GraphQL operations, timed as the webserver runs them.

The scale benchmark asks what the UI costs at thousands of accounts: the asset pages, the lineage
graph and the catalog all ask the webserver for partition health, latest materializations and
asset definitions, and those answers grow with the number of `meta_ad_account` partitions.
Guessing a query of our own would time something the UI never sends, so this module times the
UI's operations themselves, word for word:

- `bench/ui_queries.graphql` holds them, taken from the source maps shipped inside the installed
  dagster-webserver bundle (`_next/static/chunks/*.js.map`, whose `sourcesContent` is the UI's
  TypeScript), each with the fragments its gql`...${FRAGMENT}` interpolations pull in, resolved
  recursively and appended once. `python bench/_ui.py --extract` rewrites it from the installed
  bundle (do that after upgrading Dagster).
- `run_operation` executes one of them as `dagster_webserver.graphql.GraphQLServer` does for a
  POST to /graphql: a fresh request context from the workspace process context, parse,
  validate with the specified rules, execute on the webserver's schema, JSON-encode the answer
  as starlette's `JSONResponse` does. It returns the wall time of all of that and the size of
  the answer; an answer with errors (GraphQL errors, or an exception a resolver turned into a
  `PythonError`) raises with the error text, so a figure is never the time of a failure.
- `variables_for` gives each operation the variables the UI passes for one asset.

`python bench/_ui.py` checks everything on a throwaway instance: a temporary DAGSTER_HOME, a
few account partitions, one runless materialization of `ad_spend_daily`, the real
`rastro_assets` code location, and every operation run once for `ad_spend_daily`.
"""

import asyncio
import functools
import glob
import json
import os
import re
import sys
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

QUERIES_FILE = Path(__file__).resolve().parent / "ui_queries.graphql"
SEPARATOR = "# --- "
OPERATIONS = (
    "PartitionHealthQuery",
    "AssetGraphLiveQuery",
    "AssetCatalogTableQuery",
    "AssetViewDefinitionQuery",
    "AssetHealthQuery",
)
# What the UI passes (ui-core/src/assets/useAllAssets.tsx: DEFAULT_BATCH_LIMIT, the page size
# the catalog's asset list is fetched by; AssetHealthDataProvider batches 250 keys a request).
CATALOG_BATCH_LIMIT = 1000

_SCHEMA = None


def schema():
    """The schema the webserver serves (`DagsterWebserver.build_graphql_schema`), built once."""
    global _SCHEMA
    if _SCHEMA is None:
        from dagster_graphql.schema import create_schema

        _SCHEMA = create_schema()
    return _SCHEMA


@functools.cache
def load_operations() -> dict[str, str]:
    """Operation name -> full text (the operation and the fragments it uses)."""
    operations: dict[str, str] = {}
    name = None
    lines: list[str] = []
    for line in QUERIES_FILE.read_text().splitlines():
        if line.startswith(SEPARATOR):
            if name:
                operations[name] = "\n".join(lines).strip() + "\n"
            name, lines = line[len(SEPARATOR) :].strip(), []
        elif name:
            lines.append(line)
    if name:
        operations[name] = "\n".join(lines).strip() + "\n"
    return operations


def run_operation(workspace_process_context, name: str, variables: dict) -> tuple[float, int]:
    """Runs one UI operation as the webserver does; (wall seconds, bytes of the JSON answer)."""
    from dagster_graphql.implementation.utils import ErrorCapture
    from graphql import execute, parse, specified_rules, validate

    text = load_operations()[name]
    graphql_schema = schema().graphql_schema
    captured: list[Exception] = []
    start = time.perf_counter()
    with workspace_process_context.create_request_context() as request_context:
        document = parse(text)
        errors = validate(graphql_schema, document, rules=specified_rules)
        if errors:
            raise RuntimeError(f"{name} does not validate: {errors}")
        with ErrorCapture.watch(captured.append):
            result = execute(
                schema=graphql_schema,
                document=document,
                context_value=request_context,
                variable_values=variables,
                operation_name=name,
            )
            if asyncio.iscoroutine(result):
                result = asyncio.run(result)
        answer = {"data": result.data}
        if result.errors:
            answer["errors"] = [error.formatted for error in result.errors]
        # starlette's JSONResponse.render
        body = json.dumps(
            answer, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")
        ).encode("utf-8")
    seconds = time.perf_counter() - start
    if result.errors or captured:
        problems = [str(error) for error in result.errors or []]
        problems += [f"{type(error).__name__}: {error}" for error in captured]
        raise RuntimeError(f"{name} failed: " + "\n".join(problems))
    return seconds, len(body)


def variables_for(name: str, asset_key_path: list[str]) -> dict:
    """The variables the UI sends with each operation, for one asset."""
    asset_key = {"path": list(asset_key_path)}
    if name in ("PartitionHealthQuery", "AssetViewDefinitionQuery"):
        return {"assetKey": asset_key}  # the asset's page
    if name in ("AssetGraphLiveQuery", "AssetHealthQuery"):
        return {"assetKeys": [asset_key]}  # batched by the live-data providers
    if name == "AssetCatalogTableQuery":
        return {"cursor": None, "limit": CATALOG_BATCH_LIMIT}  # every asset, first page
    raise KeyError(name)


# --- extraction from the installed bundle ---------------------------------------------------


def _bundle_dir() -> Path:
    import dagster_webserver

    return Path(dagster_webserver.__file__).parent / "webapp/build/_next/static/chunks"


def extract_operations(names=OPERATIONS) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """(operation -> full text, operation -> source file, notes) from the bundle's source maps."""
    from graphql import FragmentDefinitionNode, OperationDefinitionNode, parse, visit
    from graphql.language import Visitor

    sources: dict[str, str] = {}
    for map_file in sorted(glob.glob(str(_bundle_dir() / "*.js.map"))):
        source_map = json.loads(Path(map_file).read_text())
        for source, content in zip(
            source_map.get("sources", []), source_map.get("sourcesContent") or [], strict=False
        ):
            if content and source not in sources:
                sources[source] = content

    # Every gql`...` template, its ${FRAGMENT} interpolations dropped (they are resolved by the
    # fragment names the text spreads); each definition kept as the UI wrote it.
    fragments: dict[str, tuple[str, str]] = {}
    operations: dict[str, tuple[str, str, dict[str, str]]] = {}
    notes: list[str] = []
    for source, content in sources.items():
        for template in re.finditer(r"\bgql`(.*?)`", content, re.S):
            text = re.sub(r"\$\{[^}]*\}", "", template.group(1))
            try:
                document = parse(text)
            except Exception:
                continue
            local: dict[str, str] = {}
            for node in document.definitions:
                indent = " " * (node.loc.start_token.column - 1)  # 1-based column
                body = textwrap.dedent(indent + text[node.loc.start : node.loc.end]).strip()
                if isinstance(node, FragmentDefinitionNode):
                    local[node.name.value] = body
                    seen = fragments.get(node.name.value)
                    if seen and seen[0] != body:
                        notes.append(f"fragment {node.name.value} differs in {seen[1]}, {source}")
                    fragments.setdefault(node.name.value, (body, source))
                elif isinstance(node, OperationDefinitionNode) and node.name:
                    operations.setdefault(node.name.value, (body, source, local))

    class Spreads(Visitor):
        def __init__(self):
            super().__init__()
            self.names: list[str] = []

        def enter_fragment_spread(self, node, *_):
            self.names.append(node.name.value)

    def spreads(body: str) -> list[str]:
        visitor = Spreads()
        visit(parse(body), visitor)
        return visitor.names

    texts: dict[str, str] = {}
    files: dict[str, str] = {}
    for name in names:
        if name not in operations:
            notes.append(f"{name}: not in the bundle")
            continue
        body, source, local = operations[name]
        used: list[str] = []
        pending = spreads(body)
        while pending:
            fragment = pending.pop(0)
            if fragment in used:
                continue
            used.append(fragment)
            pending += spreads(local.get(fragment) or fragments[fragment][0])
        parts = [body] + [local.get(f) or fragments[f][0] for f in used]
        texts[name] = "\n\n".join(parts) + "\n"
        files[name] = source
    return texts, files, notes


def write_queries_file() -> list[str]:
    from importlib.metadata import version

    from graphql import parse, validate

    texts, files, notes = extract_operations()
    for name, text in texts.items():
        errors = validate(schema().graphql_schema, parse(text))
        if errors:
            notes.append(f"{name} does not validate: {errors}")
    maps = sorted(
        Path(path).name
        for path in glob.glob(str(_bundle_dir() / "*.js.map"))
        if any(source in Path(path).read_text() for source in set(files.values()))
    )
    header = [
        "# The Dagster UI's own GraphQL operations, for bench/_ui.py (scale UI figures).",
        f"# Extracted from dagster-webserver {version('dagster-webserver')}: the source maps",
        "# dagster_webserver/webapp/build/_next/static/chunks/" + ", ".join(maps) + ",",
        "# with each operation's fragments (gql`...${FRAGMENT}`) resolved and appended once.",
        "# Regenerate with `.venv/bin/python bench/_ui.py --extract`. Sources:",
    ]
    header += [f"#   {name}: {source.split('../', 1)[-1]}" for name, source in files.items()]
    body = [f"{SEPARATOR}{name}\n{text}" for name, text in texts.items()]
    QUERIES_FILE.write_text("\n".join(header) + "\n\n" + "\n".join(body))
    return notes


# --- the check ------------------------------------------------------------------------------


def check() -> None:
    import tempfile

    import dagster as dg
    from _world import workspace_context

    from rastro_assets import shards

    with tempfile.TemporaryDirectory() as home:
        Path(home, "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
        os.environ["DAGSTER_HOME"] = home
        instance = dg.DagsterInstance.get()
        instance.add_dynamic_partitions(
            shards.accounts_name(0), [f"act_{100000 + n}" for n in range(5)]
        )
        instance.report_runless_asset_event(
            dg.AssetMaterialization(asset_key="ad_spend_daily", partition="act_100000|2026-11-30")
        )
        with workspace_context(instance) as context:
            for name in load_operations():
                variables = variables_for(name, ["ad_spend_daily"])
                run_operation(context, name, variables)  # warm: loaders, imports
                seconds, size = run_operation(context, name, variables)
                print(f"{name:26} {seconds * 1000:8.1f} ms {size:8,} bytes")
        instance.dispose()


if __name__ == "__main__":
    if "--extract" in sys.argv[1:]:
        for note in write_queries_file():
            print(note)
        print(f"wrote {QUERIES_FILE}: {', '.join(load_operations())}")
    else:
        check()
