// KryoRecordsTest: HashMerge's direct Kryo reads (KryoRecords) give the same keys and values as
// Spark's own KryoDeserializationStream over Feed, record by record in the order index's order,
// for records written as the map side writes them (one Kryo stream, flushed per record) with
// spark.kryo.unsafe off and on (the two Input classes read different bytes), over sources cut
// into parts at random places; an index entry one byte off either way is an error, not a misread;
// a serializer other than Spark's KryoSerializerInstance is read through the stream. No Spark
// context. Randomized: prints its seed (rerun with -Dslipstream.seed=N).
package io.slipstream.spark.shuffle;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.io.ByteArrayOutputStream;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;
import org.apache.spark.SparkConf;
import org.apache.spark.serializer.DeserializationStream;
import org.apache.spark.serializer.JavaSerializer;
import org.apache.spark.serializer.KryoSerializer;
import org.apache.spark.serializer.SerializationStream;
import org.apache.spark.serializer.SerializerInstance;
import org.junit.jupiter.api.Test;
import scala.Tuple2;
import scala.reflect.ClassTag;
import scala.reflect.ClassTag$;

class KryoRecordsTest {
    static final int CASES = 60;
    private static final ClassTag<Object> ANY = ClassTag$.MODULE$.Any();

    /** Records of assorted types, written as the map side does; the index entries as they are. */
    record Written(byte[] bytes, Object[] keys, Object[] values, int[] hashes) {}

    static Object value(Random r, int i) {
        return switch (r.nextInt(5)) {
            case 0 -> i;
            case 1 -> "v" + i + "-".repeat(r.nextInt(40));
            case 2 -> { byte[] b = new byte[r.nextInt(300)]; r.nextBytes(b); yield b; }
            case 3 -> new Tuple2<>((long) i << 20, "t" + i);
            default -> null;
        };
    }

    static Written write(Random r, SerializerInstance ser, int count, HashOrder.Builder index) {
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        SerializationStream s = ser.serializeStream(out);
        Object[] keys = new Object[count];
        Object[] values = new Object[count];
        int[] hashes = new int[count];
        for (int i = 0; i < count; i++) {
            keys[i] = r.nextBoolean() ? (Object) (r.nextInt(50) - 25) : "k" + r.nextInt(50);
            values[i] = value(r, i);
            hashes[i] = HashOrder.hash(keys[i]);
            long start = out.size();
            s.writeKey(keys[i], ANY);
            s.writeValue(values[i], ANY);
            s.flush();
            index.add(hashes[i], start, out.size() - start);
        }
        s.close();
        return new Written(out.toByteArray(), keys, values, hashes);
    }

    static HashMerge.Cursor cursor(Random r, byte[] records, byte[] index) {
        byte[] all = new byte[records.length + index.length];
        System.arraycopy(records, 0, all, 0, records.length);
        System.arraycopy(index, 0, all, records.length, index.length);
        return new HashMerge.Cursor(new HashMerge.Source(HashMergeCursorTest.split(r, all, r.nextInt(6)), () -> {}));
    }

    static void assertSame(Object want, Object got, String where) {
        if (want instanceof byte[] w) {
            assertArrayEquals(w, (byte[]) got, where);
        } else {
            assertEquals(want, got, where);
        }
    }

    @Test
    void readsWhatSparksStreamReadsWithAndWithoutUnsafe() {
        TestSeed seed = TestSeed.of("KryoRecordsTest");
        Random r = seed.random();
        for (boolean unsafe : new boolean[] {false, true}) {
            SerializerInstance ser = new KryoSerializer(new SparkConf(false).set("spark.kryo.unsafe", Boolean.toString(unsafe)))
                    .newInstance();
            for (int c = 0; c < CASES; c++) {
                int count = 1 + r.nextInt(80);
                HashOrder.Builder b = new HashOrder.Builder();
                Written w = write(r, ser, count, b);
                byte[] index = b.finish();
                HashMerge.Cursor direct = cursor(r, w.bytes(), index);
                HashMerge.Cursor viaStream = cursor(r, w.bytes(), index);
                HashMerge.KryoRecords kryo = HashMerge.KryoRecords.of(ser);
                assertNotNull(kryo, "Spark's KryoSerializerInstance is read directly");
                HashMerge.Feed feed = new HashMerge.Feed();
                DeserializationStream stream = ser.deserializeStream(feed);
                for (int k = 0; k < count; k++) {
                    String where = "seed " + seed + " unsafe " + unsafe + " case " + c + " entry " + k;
                    kryo.read(direct);
                    feed.serve(viaStream);
                    Object key = stream.readKey(ANY);
                    Object val = stream.readValue(ANY);
                    feed.check();
                    assertSame(key, kryo.key, where);
                    assertSame(val, kryo.value, where);
                    // And they are the record written with this hash (hash order, then write order).
                    assertEquals(HashOrder.hash(key), direct.hash, where);
                    direct.advance();
                    viaStream.advance();
                }
                kryo.close();
                stream.close();
            }
        }
    }

    @Test
    void anIndexEntryOffByOneByteIsAnError() {
        Random r = new Random(7);
        SerializerInstance ser = new KryoSerializer(new SparkConf(false)).newInstance();
        for (int delta : new int[] {-1, 1}) {
            HashOrder.Builder real = new HashOrder.Builder();
            Written w = write(r, ser, 3, real);
            // The same records, the first entry's length one byte short or long.
            HashOrder.Builder bad = new HashOrder.Builder();
            List<long[]> entries = new ArrayList<>();
            ByteBuffer idx = ByteBuffer.wrap(real.finish());
            for (int i = 0; i < 3; i++) {
                entries.add(new long[] {idx.getInt(), idx.getLong(), idx.getInt()});
            }
            for (int i = 0; i < 3; i++) {
                long[] e = entries.get(i);
                bad.add((int) e[0], e[1], e[2] + (i == 0 ? delta : 0));
            }
            HashMerge.Cursor cur = cursor(r, w.bytes(), bad.finish());
            HashMerge.KryoRecords kryo = HashMerge.KryoRecords.of(ser);
            assertThrows(IllegalStateException.class, () -> kryo.read(cur), "length off by " + delta);
        }
    }

    @Test
    void otherSerializersAreReadThroughTheirStream() {
        assertNull(HashMerge.KryoRecords.of(new JavaSerializer(new SparkConf(false)).newInstance()));
    }
}
