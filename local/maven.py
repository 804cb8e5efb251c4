"""Resolve a JVM server's classpath from a small pom under local/<name>/ with Maven.

The classpath file lands in .cache/classpath/<name>.txt and points into ~/.m2, so Maven's cache is
the only copy of the jars; it is rebuilt when the pom changes.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from local.layout import REPO_ROOT


class MavenError(Exception):
    """Maven could not resolve the artifacts; the message carries Maven's own output."""


def pom(name: str) -> Path:
    return REPO_ROOT / "local" / name / "pom.xml"


def classpath_file(name: str) -> Path:
    return REPO_ROOT / ".cache" / "classpath" / f"{name}.txt"


def resolve(name: str, offline_ok: bool = True) -> str:
    """Return the classpath for local/<name>/pom.xml, running Maven only when needed."""
    out = classpath_file(name)
    p = pom(name)
    if out.exists() and out.stat().st_mtime >= p.stat().st_mtime and out.read_text().strip():
        return out.read_text().strip()
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        "mvn",
        "-B",
        "-q",
        "-f",
        str(p),
        "dependency:build-classpath",
        f"-Dmdep.outputFile={out}",
        "-Dmdep.includeScope=runtime",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 or not out.exists():
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-20:])
        raise MavenError(f"mvn could not resolve {p}:\n{tail}")
    return out.read_text().strip()


def jar_path(coordinates: str) -> Path:
    """Where jar() puts `group:artifact:version` (it may not be there yet)."""
    _group, artifact, version = coordinates.split(":")
    return REPO_ROOT / ".cache" / "jars" / f"{artifact}-{version}.jar"


def jar(coordinates: str) -> Path:
    """One jar, `group:artifact:version`, copied from Maven Central into .cache/jars once (a
    Java agent, not a classpath: it has no dependencies of its own)."""
    out = jar_path(coordinates)
    if out.exists() and out.stat().st_size > 0:
        return out
    cmd = [
        "mvn",
        "-B",
        "-q",
        "dependency:copy",
        f"-Dartifact={coordinates}",
        f"-DoutputDirectory={out.parent}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 or not out.exists():
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-20:])
        raise MavenError(f"mvn could not copy {coordinates}:\n{tail}")
    return out


if __name__ == "__main__":  # `python -m local.maven kafka cassandra` prefetches for setup
    import sys

    from infra import exporters

    for n in sys.argv[1:]:
        cp = resolve(n)
        print(f"{n}: {len(cp.split(':'))} jars")
    print(f"JMX exporter agent: {jar(exporters.JMX_AGENT)}")
