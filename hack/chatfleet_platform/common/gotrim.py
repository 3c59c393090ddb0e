"""Leave out of two Go builds the plug-ins the local platform never loads (hack/build-platform.sh).

KEDA compiles every scaler it ships (74, with the SDKs of AWS, Azure, GCP, Elasticsearch, Kafka, ...)
into one package, and Traefik every DNS provider of its ACME client lego (about 190, each with its
cloud's SDK) and its AWS ECS provider. The local platform's KEDA serves the operator's ``prometheus``
triggers only, and its Traefik serves HTTPRoutes from its Kubernetes providers with no ACME at all, so both
builds take the plug-ins out of their copy of the source, the way Prometheus's own plugins.yml takes out
service discoveries:

* ``keda ROOT``: in a copy of KEDA's module, removes every ``pkg/scalers/*_scaler.go`` but
  ``KEDA_SCALERS_KEPT`` and drops their cases from the trigger switch of ``pkg/scaling/scalers_builder.go``
  (an unknown trigger type then fails as any unknown type does: "no scaler found for type");
* ``lego FILE``: rewrites lego's ``providers/dns/zz_gen_dns_providers.go`` (in a copy of lego's module)
  with the providers of ``LEGO_DNS_KEPT`` only;
* ``traefik-ecs ROOT``: in a copy of Traefik's module, replaces the AWS ECS provider (``pkg/provider/ecs``,
  whose EC2 client alone is a minute and a half of one core's compile) by its configuration only: the same
  ``Provider`` struct and defaults, so that Traefik's static configuration reads as before, and an
  ``Init`` that refuses to start it ("left out of this build"). The local platform's Traefik runs the
  Kubernetes providers only.

Each function returns what it left out (the command prints one line of it, which the build script keeps
beside the binary as ``trimmed``: a binary built before the trims has none and is built again), and
refuses (``TrimError``) a source whose layout it does not recognise, so a new upstream version fails the
build with that message rather than building something else.
Standard library only: the build script runs it with the machine's python3, before any venv exists.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

# the scalers the local platform's KEDA keeps: the operator's ScaledObjects use `prometheus` only
# (operator/chatfleet_operator/builders/scaledobject.py); cpu and memory are the HPA's own resources
KEDA_SCALERS_KEPT = ("prometheus_scaler.go", "cpu_memory_scaler.go")
# the DNS providers the local platform's Traefik keeps: two with no SDK (a command, an HTTP call); none is
# used, as nothing asks Traefik for a certificate here
LEGO_DNS_KEPT = ("exec", "httpreq")

CASE = re.compile(r'^\s*case "[^"]+"(?:, "[^"]+")*:\s*$')
RETURN_CALL = re.compile(r"^\s*return (?:(\w+)\.)?(\w+)\(")


class TrimError(Exception):
    """The source is not laid out as this trim expects (an upstream version changed it)."""


def drop_cases(source: str, keep: Callable[[str | None, str], bool]) -> str:
    """SOURCE without each `case "...":` line whose next line is `return [pkg.]Func(` with keep(pkg, Func)
    false (and without that line)."""
    lines = source.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if CASE.match(line) and i + 1 < len(lines):
            call = RETURN_CALL.match(lines[i + 1])
            if call and not keep(call.group(1), call.group(2)):
                i += 2
                continue
        out.append(line)
        i += 1
    return "\n".join(out)


def trim_keda(root: Path, kept: tuple[str, ...] = KEDA_SCALERS_KEPT) -> list[str]:
    """Remove the scalers of a KEDA source tree at ROOT but KEPT; the removed files' names."""
    scalers = root / "pkg" / "scalers"
    builder = root / "pkg" / "scaling" / "scalers_builder.go"
    if not builder.is_file() or not scalers.is_dir():
        raise TrimError(f"{root}: no pkg/scaling/scalers_builder.go or pkg/scalers: KEDA's layout changed")
    missing = [name for name in kept if not (scalers / name).is_file()]
    if missing:
        raise TrimError(f"{scalers}: no {', '.join(missing)}: KEDA's scalers changed")
    text = builder.read_text()
    if "TRIGGERS-START" not in text or "scalers.NewPrometheusScaler(" not in text:
        raise TrimError(
            f"{builder}: no TRIGGERS-START switch calling scalers.New...Scaler: KEDA's layout changed"
        )
    removed = sorted(p.name for p in scalers.glob("*_scaler.go") if p.name not in kept)
    # what the package keeps: the kept scalers and the files that are no scaler
    left = "\n".join(
        p.read_text()
        for p in scalers.glob("*.go")
        if p.name in kept or not p.name.endswith(("_test.go", "_scaler.go"))
    )
    # a name the kept files use that only a removed one declares: the one known is the metric type
    # constant of azure_queue_scaler.go, declared again here if the kept files use it undeclared
    needs_type = "externalMetricType" in left and not re.search(r"\bexternalMetricType\s+=", left)
    constructors = set(re.findall(r"^func (New\w+)\(", left, re.M))
    for name in removed:
        (scalers / name).unlink()
    trimmed = drop_cases(text, lambda pkg, func: pkg != "scalers" or func in constructors)
    builder.write_text(trimmed)
    if needs_type:
        (scalers / "zz_chatfleet_trimmed.go").write_text(
            "package scalers\n\n"
            "// Written by hack/build-platform.sh: declared in azure_queue_scaler.go, which this build leaves out.\n"
            'const externalMetricType = "External"\n'
        )
    # the scalers' own tests would not compile without the removed files; this copy is only built
    for test in scalers.glob("*_test.go"):
        test.unlink()
    return removed


def trim_lego_dns(path: Path, kept: tuple[str, ...] = LEGO_DNS_KEPT) -> list[str]:
    """Rewrite lego's DNS provider factory at PATH with the providers KEPT only; the left-out packages."""
    text = path.read_text()
    prefix = "github.com/go-acme/lego/v4/providers/dns/"
    imported = re.findall(rf'^\s*"{re.escape(prefix)}(\w+)"$', text, re.M)
    if "func NewDNSChallengeProviderByName(" not in text or not imported:
        raise TrimError(
            f"{path}: no NewDNSChallengeProviderByName over imported providers: lego's layout changed"
        )
    missing = [name for name in kept if name not in imported]
    if missing:
        raise TrimError(f"{path}: no DNS provider {', '.join(missing)}: lego's providers changed")
    trimmed = drop_cases(text, lambda pkg, func: pkg in kept)
    left_out = [name for name in imported if name not in kept]
    dropped = {f'\t"{prefix}{name}"' for name in left_out}
    trimmed = "\n".join(line for line in trimmed.split("\n") if line not in dropped)
    used = set(re.findall(r"^\s*return (\w+)\.NewDNSProvider", trimmed, re.M))
    if used != set(kept):
        raise TrimError(f"{path}: the trimmed factory calls {sorted(used)}, not {sorted(kept)}")
    path.write_text(trimmed)
    return left_out


ECS_LEFT_OUT = "the ECS provider is left out of this Traefik build (hack/build-platform.sh)"


def go_block(text: str, opening: str) -> str | None:
    """The lines of Go TEXT from the one starting with OPENING to the next line that is exactly `}`."""
    m = re.search(rf"^{re.escape(opening)}.*?^\}}$", text, re.M | re.S)
    return m.group(0) if m else None


def trim_traefik_ecs(root: Path) -> list[str]:
    """Replace the ECS provider of a Traefik source tree at ROOT by its configuration only; the removed files."""
    ecs = root / "pkg" / "provider" / "ecs"
    source = ecs / "ecs.go"
    if not source.is_file():
        raise TrimError(f"{ecs}: no ecs.go: Traefik's ECS provider moved")
    text = source.read_text()
    struct = go_block(text, "type Provider struct {")
    defaults = go_block(text, "func (p *Provider) SetDefaults() {")
    rule = re.search(r"^const DefaultTemplateRule = .*$", text, re.M)
    if (
        not struct
        or not defaults
        or not rule
        or not re.search(r"defaultRuleTpl\s+\*template\.Template", struct)
    ):
        raise TrimError(
            f"{source}: no Provider struct, SetDefaults or DefaultTemplateRule: Traefik's ECS provider changed"
        )
    removed = sorted(p.name for p in ecs.glob("*.go"))
    for p in ecs.glob("*.go"):
        p.unlink()
    (ecs / "ecs.go").write_text(
        "// Written by hack/build-platform.sh: Traefik's AWS ECS provider, its configuration only. The local\n"
        "// platform's Traefik runs the Kubernetes providers; the static configuration reads as before, and the\n"
        "// AWS SDK clients the provider needs are left out of the build.\n\n"
        "package ecs\n\n"
        'import (\n\t"errors"\n\t"text/template"\n\n'
        '\t"github.com/traefik/traefik/v3/pkg/config/dynamic"\n'
        '\t"github.com/traefik/traefik/v3/pkg/provider"\n'
        '\t"github.com/traefik/traefik/v3/pkg/safe"\n)\n\n'
        f"{struct}\n\n// DefaultTemplateRule The default template for the default rule.\n{rule.group(0)}\n\n"
        "var _ provider.Provider = (*Provider)(nil)\n\n"
        f"// SetDefaults sets the default values.\n{defaults}\n\n"
        f'var errLeftOut = errors.New("{ECS_LEFT_OUT}")\n\n'
        "// Init refuses: the provider is not in this build.\n"
        "func (p *Provider) Init() error { return errLeftOut }\n\n"
        "// Provide refuses: the provider is not in this build.\n"
        "func (p *Provider) Provide(chan<- dynamic.Message, *safe.Pool) error { return errLeftOut }\n"
    )
    return removed


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("keda", "lego", "traefik-ecs"):
        print(
            "usage: python3 -m chatfleet_platform.common.gotrim"
            " keda KEDA_ROOT | lego DNS_PROVIDERS_GO | traefik-ecs TRAEFIK_ROOT",
            file=sys.stderr,
        )
        return 2
    try:
        if argv[0] == "traefik-ecs":
            gone = trim_traefik_ecs(Path(argv[1]))
            print(f"traefik: the ECS provider ({len(gone)} files) replaced by its configuration only")
        elif argv[0] == "keda":
            gone = trim_keda(Path(argv[1]))
            print(f"keda: {len(gone)} scalers left out, kept {', '.join(KEDA_SCALERS_KEPT)}")
        else:
            gone = trim_lego_dns(Path(argv[1]))
            print(f"lego: {len(gone)} DNS providers left out, kept {', '.join(LEGO_DNS_KEPT)}")
    except (TrimError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
