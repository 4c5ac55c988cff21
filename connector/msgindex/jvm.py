"""Java artifacts from Maven Central, staged into a project-local folder and reused.

The local Kafka broker, Spark's Kafka connector and the interop tests all need jars that pip does
not ship. Each set is resolved once with Maven (``dependency:copy-dependencies``) into
``<home>/jars/<name>/`` and reused while its artifact list is unchanged; ``~/.m2`` caches the
downloads across sets. Nothing here is a build of third-party source: only published jars.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
from pathlib import Path
from xml.sax.saxutils import escape

from msgindex.errors import MsgIndexError, ToolMissingError

HOME_ENV = "MSGINDEX_HOME"
_STAMP = ".staged"


def msgindex_home() -> Path:
    """Where msgindex keeps jars and local broker data: $MSGINDEX_HOME, else `.msgindex/` in the
    source checkout the package runs from, else ~/.cache/msgindex."""
    if os.environ.get(HOME_ENV):
        return Path(os.environ[HOME_ENV]).expanduser().resolve()
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "pyproject.toml").is_file() and (checkout / "connector").is_dir():
        return checkout / ".msgindex"
    return Path.home() / ".cache" / "msgindex"


def require_tool(name: str, purpose: str) -> str:
    """Absolute path of executable `name`, or ToolMissingError saying what needs it."""
    found = shutil.which(name)
    if not found:
        raise ToolMissingError(
            f"'{name}' is not on PATH; it is needed to {purpose}. Install it (e.g. a JDK 17+ for "
            f"java, Apache Maven for mvn) and try again."
        )
    return found


def _pom(name: str, artifacts: list[str], exclusions: tuple[str, ...] = ()) -> str:
    excluded = "".join(
        f"<exclusion><groupId>{escape(g)}</groupId><artifactId>{escape(a)}</artifactId></exclusion>"
        for g, a in (_group_artifact(e) for e in exclusions)
    )
    deps = []
    for coordinate in artifacts:
        parts = coordinate.split(":")
        if len(parts) not in (3, 4):
            raise ValueError(f"artifact {coordinate!r} is not group:artifact:version[:classifier]")
        group, artifact, version = (escape(p) for p in parts[:3])
        classifier = f"<classifier>{escape(parts[3])}</classifier>" if len(parts) == 4 else ""
        deps.append(
            f"    <dependency><groupId>{group}</groupId><artifactId>{artifact}</artifactId>"
            f"<version>{version}</version>{classifier}"
            + (f"<exclusions>{excluded}</exclusions>" if excluded else "")
            + "</dependency>"
        )
    return f"""<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>msgindex.staging</groupId>
  <artifactId>{escape(name)}</artifactId>
  <version>0</version>
  <packaging>pom</packaging>
  <dependencies>
{chr(10).join(deps)}
  </dependencies>
</project>
"""


def _group_artifact(coordinate: str) -> tuple[str, str]:
    parts = coordinate.split(":")
    if len(parts) != 2:
        raise ValueError(f"exclusion {coordinate!r} is not group:artifact")
    return parts[0], parts[1]


def stage_jars(name: str, artifacts: list[str], *, exclusions: tuple[str, ...] = ()) -> list[Path]:
    """The runtime classpath (jar paths) of `artifacts`, resolved with Maven into
    ``<home>/jars/<name>/lib`` on first use. Safe to call from several processes at once.

    `artifacts` are "group:artifact:version" or "group:artifact:version:classifier" (a shaded jar);
    `exclusions` ("group:artifact", "*:*" for all) are cut from every artifact's transitive
    dependencies: for a dependency that is provided another way (or bundled in a shaded jar), or
    one whose pinned version a registry lacks."""
    folder = msgindex_home() / "jars" / name
    recipe = [*artifacts, *(["exclude", *exclusions] if exclusions else [])]
    wanted = hashlib.sha256("\n".join(recipe).encode()).hexdigest()
    lib = folder / "lib"
    with _exclusive(folder):
        stamp = folder / _STAMP
        if not (stamp.is_file() and stamp.read_text() == wanted and lib.is_dir()):
            mvn = require_tool("mvn", f"download the jars of {name} from Maven Central")
            shutil.rmtree(lib, ignore_errors=True)
            (folder / "pom.xml").write_text(_pom(name, artifacts, exclusions))
            done = subprocess.run(
                [mvn, "-q", "-B", "-f", str(folder / "pom.xml"), "dependency:copy-dependencies",
                 "-DincludeScope=runtime", f"-DoutputDirectory={lib}"],
                capture_output=True, text=True,
            )
            if done.returncode != 0:
                raise MsgIndexError(
                    f"Maven could not resolve {', '.join(artifacts)} for {name}:\n"
                    f"{(done.stdout + done.stderr)[-3000:]}"
                )
            stamp.write_text(wanted)
    return sorted(lib.glob("*.jar"))


def compile_java(name: str, source_dir: Path, classpath: list[Path]) -> Path:
    """Compile every .java file under `source_dir` against `classpath` into
    ``<home>/classes/<name>`` (recompiled when a source is newer) and return that folder."""
    javac = require_tool("javac", f"compile the Java harness {name}")
    out = msgindex_home() / "classes" / name
    sources = sorted(Path(source_dir).rglob("*.java"))
    if not sources:
        raise MsgIndexError(f"{source_dir}: no .java sources to compile for {name}")
    stamp = out / _STAMP
    newest = max(s.stat().st_mtime for s in sources)
    with _exclusive(out):
        if stamp.is_file() and stamp.stat().st_mtime >= newest:
            return out
        done = subprocess.run(
            [javac, "-nowarn", "-d", str(out), "-cp", os.pathsep.join(map(str, classpath)),
             *map(str, sources)],
            capture_output=True, text=True,
        )
        if done.returncode != 0:
            raise MsgIndexError(f"javac failed for {name}:\n{done.stderr[-3000:]}")
        stamp.touch()
    return out


def java_command(classpath: list[Path], main_class: str, *args: str, heap: str = "512m") -> list[str]:
    """argv that runs `main_class` on `classpath` with a small heap (this is a 2-core machine)."""
    java = require_tool("java", f"run {main_class}")
    return [java, f"-Xmx{heap}", "-cp", os.pathsep.join(map(str, classpath)), main_class, *args]


class _exclusive:
    """An flock on `<folder>/.lock`, creating the folder: one process stages or compiles at a time."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def __enter__(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.handle = open(self.folder / ".lock", "w")
        fcntl.flock(self.handle, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        self.handle.close()
