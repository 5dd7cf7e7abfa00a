package io.slipstream.hbase;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.function.Consumer;

/**
 * Ties a helper JVM's life to its parent: a daemon thread reads standard input line by line,
 * hands each line to the caller (a test's command), and exits the JVM when input ends (the parent
 * closed the pipe or went away), so a test that dies leaves no HBase process behind. The one home
 * of that rule for every mode of {@link Main}. Not for production servers, which HBase's scripts
 * start and stop.
 */
final class StdinWatch {
  private StdinWatch() {}

  /** Starts the watching thread; {@code onLine} runs on it for every line, trimmed. */
  static void start(Consumer<String> onLine) {
    Thread t = new Thread(() -> {
      try {
        BufferedReader r = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        for (String line = r.readLine(); line != null; line = r.readLine()) {
          onLine.accept(line.trim());
        }
      } catch (IOException e) {
        // Closed: the same as the end of input.
      }
      System.exit(0);
    }, "stdin-watch");
    t.setDaemon(true);
    t.start();
  }
}
