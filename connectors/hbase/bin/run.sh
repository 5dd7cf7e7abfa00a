#!/usr/bin/env bash
# Runs the HBase connector's JVM (io.slipstream.hbase.Main) with the Java 17 module openings HBase
# needs. Usage: run.sh mini [--sidecar-port N] [--dir D] | run.sh sidecar --zk host:port [--port N]
# | run.sh rs --zk host:port --rootdir R --advertise-host H --observer-port P (see Main)
# Needs `mvn -DskipTests package dependency:build-classpath -Dmdep.outputFile=target/classpath.txt`
# first (`make hbase-build`). HBASE_HEAP (default 768m) sets -Xmx.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
cp_file="$here/target/classpath.txt"
[ -f "$cp_file" ] && [ -d "$here/target/classes" ] || { echo "run.sh: build first (make hbase-build)" >&2; exit 1; }
exec java -Xmx"${HBASE_HEAP:-768m}" -XX:+UseSerialGC \
  --add-opens=java.base/java.lang=ALL-UNNAMED --add-opens=java.base/java.nio=ALL-UNNAMED \
  --add-opens=java.base/sun.nio.ch=ALL-UNNAMED --add-opens=java.base/java.util=ALL-UNNAMED \
  --add-opens=java.base/java.lang.reflect=ALL-UNNAMED --add-opens=java.base/java.io=ALL-UNNAMED \
  --add-exports=java.base/jdk.internal.misc=ALL-UNNAMED \
  -cp "$here/target/classes:$(cat "$cp_file")" io.slipstream.hbase.Main "$@"
