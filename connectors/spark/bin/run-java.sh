#!/usr/bin/env bash
# run-java.sh CLASS [ARGS...]: runs a class of this module (examples, the benchmark driver) on
# a local JVM with Spark on the classpath (the `provided` dependencies from ~/.m2) and the
# module openings Spark needs on Java 17. Compiles the module and writes the classpath file
# once (target/classpath.txt); SPARK_JAVA_OPTS adds JVM options. Not for real clusters: there,
# use spark-submit with --jars target/slipstream-spark-*.jar.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MVN="${MVN:-mvn -B -ntp -q}"
if [[ ! -f "$HERE/target/classpath.txt" || "$HERE/pom.xml" -nt "$HERE/target/classpath.txt" ]]; then
    (cd "$HERE" && $MVN dependency:build-classpath -Dmdep.outputFile=target/classpath.txt >/dev/null)
fi
if [[ -z "${SKIP_COMPILE:-}" ]]; then
    (cd "$HERE" && $MVN compile >/dev/null)
fi
OPENS=(--add-opens=java.base/java.lang=ALL-UNNAMED --add-opens=java.base/java.lang.invoke=ALL-UNNAMED
    --add-opens=java.base/java.lang.reflect=ALL-UNNAMED --add-opens=java.base/java.io=ALL-UNNAMED
    --add-opens=java.base/java.net=ALL-UNNAMED --add-opens=java.base/java.nio=ALL-UNNAMED
    --add-opens=java.base/java.util=ALL-UNNAMED --add-opens=java.base/java.util.concurrent=ALL-UNNAMED
    --add-opens=java.base/java.util.concurrent.atomic=ALL-UNNAMED --add-opens=java.base/sun.nio.ch=ALL-UNNAMED
    --add-opens=java.base/sun.nio.cs=ALL-UNNAMED --add-opens=java.base/sun.security.action=ALL-UNNAMED
    --add-opens=java.base/sun.util.calendar=ALL-UNNAMED -Djdk.reflect.useDirectMethodHandle=false
    -Dio.netty.tryReflectionSetAccessible=true -Dlog4j2.configurationFile="$HERE/conf/log4j2.properties")
# shellcheck disable=SC2086
exec java "${OPENS[@]}" ${SPARK_JAVA_OPTS:-} -cp "$HERE/target/classes:$(cat "$HERE/target/classpath.txt")" "$@"
