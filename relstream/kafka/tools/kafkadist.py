"""Apache Kafka's jars: fetched once from Maven Central with Maven (`make setup`), found
by `relstream broker`, checked against the Java that runs them.

The pinned release is the pom's (`apache/pom.xml`); its runtime dependencies are copied
into the user cache dir, so a broker started from any folder finds them. Every failure
is one line saying what to install or what failed (`KafkaUnavailable`).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from importlib import resources
from pathlib import Path

import platformdirs

KAFKA_VERSION = "4.1.1"
# Kafka 4.x brokers need Java 17 (KIP-1013).
JAVA_MIN = 17
# A folder of Kafka's jars to use instead of the cache (e.g. a Kafka distribution's libs/).
LIBS_ENV = "RELSTREAM_KAFKA_LIBS"


class KafkaUnavailable(RuntimeError):
    """Java or Kafka's jars are missing or unusable; the message says what to do."""


def resource(name: str) -> Path:
    """One of the files beside the pom: `pom.xml`, `broker.properties`, `log4j2.properties`."""
    return Path(str(resources.files("relstream.kafka.tools").joinpath("apache", name)))


def libs_dir() -> Path:
    """Where the jars are: $RELSTREAM_KAFKA_LIBS, else the cache `fetch` fills."""
    if os.environ.get(LIBS_ENV):
        return Path(os.environ[LIBS_ENV])
    return Path(platformdirs.user_cache_dir("relstream")) / f"kafka-{KAFKA_VERSION}" / "libs"


def _fetched(libs: Path) -> bool:
    return all(
        any(libs.glob(f"{jar}-{KAFKA_VERSION}.jar"))
        for jar in ("kafka_2.13", "kafka-server", "kafka-tools")
    )


def java() -> str:
    """The `java` to run Kafka with ($JAVA_HOME's, else the PATH's), checked for version."""
    home = os.environ.get("JAVA_HOME")
    binary = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not binary or not Path(binary).exists():
        raise KafkaUnavailable(
            f"Apache Kafka needs Java {JAVA_MIN} or later and none was found: install it "
            f"(Debian: apt-get install openjdk-{JAVA_MIN}-jre-headless) or set JAVA_HOME"
        )
    said = subprocess.run([binary, "-version"], capture_output=True, text=True).stderr
    match = re.search(r'version "(\d+)(?:\.(\d+))?', said)
    major = int(match.group(1)) if match else 0
    if major == 1 and match and match.group(2):  # "1.8.0_x" is Java 8
        major = int(match.group(2))
    if major < JAVA_MIN:
        raise KafkaUnavailable(
            f"Apache Kafka {KAFKA_VERSION} needs Java {JAVA_MIN} or later; {binary} is "
            f"Java {major or '(unknown)'}: install a newer one or point JAVA_HOME at it"
        )
    return binary


def classpath() -> str:
    """The classpath of the fetched broker, or one line saying how to fetch it."""
    libs = libs_dir()
    if not _fetched(libs):
        raise KafkaUnavailable(
            f"Apache Kafka {KAFKA_VERSION} is not fetched (no jars in {libs}): run `make "
            "setup`, or `python -m relstream.kafka.tools.kafkadist` (needs Maven and Java "
            f"{JAVA_MIN}), or set {LIBS_ENV} to a Kafka distribution's libs/ folder"
        )
    return str(libs / "*")


def fetch(quiet: bool = True) -> Path:
    """Copy the pom's runtime dependencies from Maven Central into `libs_dir()` (once)."""
    java()
    libs = libs_dir()
    if _fetched(libs):
        return libs
    mvn = shutil.which("mvn")
    if mvn is None:
        raise KafkaUnavailable(
            "fetching Apache Kafka needs Maven: install it (Debian: apt-get install maven)"
        )
    partial = libs.with_name(libs.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    command = [
        mvn, "-B", "-f", str(resource("pom.xml")), "dependency:copy-dependencies",
        f"-DoutputDirectory={partial}", "-DincludeScope=runtime",
    ]  # fmt: skip
    if quiet:
        command.insert(2, "-q")
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0 or not _fetched(partial):
        errors = [line for line in done.stdout.splitlines() if "[ERROR]" in line]
        why = errors[0].replace("[ERROR]", "").strip() if errors else f"mvn exit {done.returncode}"
        raise KafkaUnavailable(
            f"fetching Apache Kafka {KAFKA_VERSION} from Maven Central failed: {why}"
        )
    shutil.rmtree(libs, ignore_errors=True)
    partial.rename(libs)
    return libs


def main() -> None:
    try:
        libs = fetch()
    except KafkaUnavailable as exc:
        sys.exit(f"error: {exc}")
    print(f"Apache Kafka {KAFKA_VERSION}: {len(list(libs.glob('*.jar')))} jars in {libs}")


if __name__ == "__main__":
    main()
