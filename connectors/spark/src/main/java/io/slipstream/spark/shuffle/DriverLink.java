// DriverLink: the driver's one control connection to the Slipstream daemon, announced with
// `DRIVER <app>` (crates/shuffle/src/proto.rs). While it is open the application lives; when the
// driver dies without UNREGISTER_APP (a crash, SIGKILL) the kernel closes it and the daemon
// unregisters the application, freeing its blocks. A thread holds it and, when the daemon ends
// it (a daemon restart), connects again and re-announces, so the restarted daemon knows the
// driver too. Not for: requests (each has its own ShuffleClient) or executors (they never say
// DRIVER: their connections ending must not end the application).
package io.slipstream.spark.shuffle;

import java.util.concurrent.Callable;

final class DriverLink implements AutoCloseable {
    /** Wait between attempts to reach a daemon that ended the link (ms). */
    static final long RECONNECT_WAIT_MS = 1_000;

    private final String app;
    private final Callable<ShuffleClient> connect;
    private final Thread thread;
    private volatile boolean closed;
    /** The open connection, closed by close() to end the thread's wait. */
    private volatile ShuffleClient current;
    /** DRIVER lines the daemon accepted: 1 at first, one more per reconnect (tests watch it). */
    private volatile int announcements;

    /** Starts the link for `app`; `connect` opens a new control connection. */
    DriverLink(String app, Callable<ShuffleClient> connect) {
        this.app = app;
        this.connect = connect;
        this.thread = new Thread(this::run, "slipstream-shuffle-driver-link");
        thread.setDaemon(true);
        thread.start();
    }

    private void run() {
        while (!closed) {
            try (ShuffleClient c = connect.call()) {
                current = c;
                if (closed) {
                    return;
                }
                c.driver(app);
                announcements++;
                c.awaitClose();
            } catch (ShuffleClient.ShuffleServiceException refused) {
                // A daemon without DRIVER (older) or a refused id: nothing to hold.
                return;
            } catch (Exception unreachable) {
                // Daemon down (restarting): try again below.
            } finally {
                current = null;
            }
            try {
                Thread.sleep(RECONNECT_WAIT_MS);
            } catch (InterruptedException e) {
                return;
            }
        }
    }

    int announcements() {
        return announcements;
    }

    /** Ends the link (after UNREGISTER_APP, or instead of it: the daemon then frees the app). */
    @Override
    public void close() {
        closed = true;
        ShuffleClient c = current;
        if (c != null) {
            c.close();
        }
        thread.interrupt();
    }
}
