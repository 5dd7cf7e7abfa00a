// UdpReceiver: the plain-Spark baseline's input, as the paper built it: a Spark Streaming
// (DStream) custom Receiver that owns a UDP socket and hands Spark every raw record itself, so
// Spark does all parsing and computing. Each datagram's records (split on '\n'; words further
// on whitespace when `words`) are stored one by one (numbers as "t_ns<TAB>value"), t_ns being
// the receive time on CLOCK_MONOTONIC (System.nanoTime), the clock of `slipstream send`.
// Not for: the Slipstream source (SlipstreamSource); this is the thing it is compared with.
package io.slipstream.spark.baseline;

import org.apache.spark.storage.StorageLevel;
import org.apache.spark.streaming.receiver.Receiver;

import java.io.IOException;
import java.net.DatagramPacket;
import java.net.DatagramSocket;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.SocketTimeoutException;
import java.nio.charset.StandardCharsets;

public final class UdpReceiver extends Receiver<String> {
    /** Largest UDP payload. */
    static final int DATAGRAM_BYTES_MAX = 65_535;
    /** Receive buffer asked for: the same 8 MiB the daemon asks for its stream sockets. */
    static final int RCVBUF_BYTES = 8 << 20;

    private final String host;
    private final int port;
    private final boolean words;
    private transient volatile DatagramSocket sock;

    public UdpReceiver(String host, int port, boolean words) {
        super(StorageLevel.MEMORY_ONLY());
        this.host = host;
        this.port = port;
        this.words = words;
    }

    @Override
    public void onStart() {
        try {
            DatagramSocket s = new DatagramSocket(null);
            s.setReceiveBufferSize(RCVBUF_BYTES);
            s.setSoTimeout(200);
            s.bind(new InetSocketAddress(InetAddress.getByName(host), port));
            sock = s;
        } catch (IOException e) {
            stop("udp receiver cannot bind " + host + ":" + port, e);
            return;
        }
        Thread t = new Thread(this::receive, "udp-receiver-" + port);
        t.setDaemon(true);
        t.start();
    }

    @Override
    public void onStop() {
        DatagramSocket s = sock;
        if (s != null) {
            s.close();
        }
    }

    private void receive() {
        byte[] buf = new byte[DATAGRAM_BYTES_MAX + 1];
        DatagramPacket p = new DatagramPacket(buf, buf.length);
        while (!isStopped()) {
            try {
                sock.receive(p);
            } catch (SocketTimeoutException e) {
                continue;
            } catch (IOException e) {
                if (!isStopped()) {
                    restart("udp receive failed", e);
                }
                return;
            }
            long t = System.nanoTime();
            String text = new String(p.getData(), p.getOffset(), p.getLength(), StandardCharsets.UTF_8);
            String prefix = t + "\t";
            // One store() per record: Spark's BlockGenerator batches them into blocks every
            // spark.streaming.blockInterval (200 ms). (store(iterator) per datagram would make
            // one block, and one driver round trip, per datagram.)
            for (String rec : text.split("\n")) {
                if (words) {
                    for (String w : rec.split("[ \t\r]+")) {
                        if (!w.isEmpty()) {
                            store(w);
                        }
                    }
                } else if (!rec.isBlank()) {
                    store(prefix + rec.trim());
                }
            }
            p.setLength(buf.length);
        }
    }
}
