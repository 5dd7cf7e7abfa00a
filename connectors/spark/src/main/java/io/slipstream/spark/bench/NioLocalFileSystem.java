package io.slipstream.spark.bench;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermissions;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;

/**
 * The local file system for the benchmark's streaming checkpoints (SparkBench sets it as
 * {@code fs.file.impl} for every setup): Hadoop's {@link RawLocalFileSystem}, whose
 * {@code setPermission} runs a {@code chmod} process per file when the native Hadoop library is
 * absent (as here: measured 40 processes per 10 s for a continuous query's offset and commit
 * logs, each file and its {@code .crc}); this one sets the same permission bits with
 * {@code java.nio} in the JVM, and being the raw file system it writes no {@code .crc} files.
 *
 * <p>Not for: anything but local checkpoint directories (a sticky bit falls back to Hadoop's way).
 */
public final class NioLocalFileSystem extends RawLocalFileSystem {
    @Override
    public void setPermission(Path p, FsPermission permission) throws IOException {
        if (permission.getStickyBit()) {
            super.setPermission(p, permission);
            return;
        }
        Files.setPosixFilePermissions(pathToFile(p).toPath(), PosixFilePermissions.fromString(permission.toString()));
    }
}
