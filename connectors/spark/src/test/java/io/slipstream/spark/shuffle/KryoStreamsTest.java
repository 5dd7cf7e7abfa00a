// KryoStreamsTest: the writer's and reader's Kryo streams with a brought Kryo are Spark's own
// streams byte for byte — records of assorted types written through KryoStreams.out equal what
// Spark's KryoSerializationStream writes, with spark.kryo.unsafe off and on; Spark's stream reads
// them back and KryoStreams.in reads Spark's bytes, ending with EOF as Spark's iterators expect
// (no record lost or added at the end); the Kryo goes back once at close, and not at all after a
// failed write. No Spark context. Randomized: prints its seed (rerun with -Dslipstream.seed=N).
package io.slipstream.spark.shuffle;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.esotericsoftware.kryo.Kryo;
import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;
import org.apache.spark.SparkConf;
import org.apache.spark.serializer.DeserializationStream;
import org.apache.spark.serializer.KryoSerializer;
import org.apache.spark.serializer.SerializationStream;
import org.apache.spark.serializer.SerializerInstance;
import org.junit.jupiter.api.Test;
import scala.Tuple2;
import scala.collection.Iterator;
import scala.reflect.ClassTag;
import scala.reflect.ClassTag$;

class KryoStreamsTest {
    static final int CASES = 40;
    private static final ClassTag<Object> ANY = ClassTag$.MODULE$.Any();

    static void writeAll(SerializationStream s, Object[] keys, Object[] values, boolean flushEach) {
        for (int i = 0; i < keys.length; i++) {
            s.writeKey(keys[i], ANY);
            s.writeValue(values[i], ANY);
            if (flushEach) {
                s.flush();
            }
        }
        s.close();
    }

    static List<Object> readAll(DeserializationStream in) {
        List<Object> out = new ArrayList<>();
        Iterator<Tuple2<Object, Object>> it = in.asKeyValueIterator();
        while (it.hasNext()) {
            Tuple2<Object, Object> t = it.next();
            out.add(t._1());
            out.add(t._2());
        }
        return out;
    }

    static void assertRecords(Object[] keys, Object[] values, List<Object> got, String where) {
        assertEquals(2 * keys.length, got.size(), where);
        for (int i = 0; i < keys.length; i++) {
            KryoRecordsTest.assertSame(keys[i], got.get(2 * i), where + " key " + i);
            KryoRecordsTest.assertSame(values[i], got.get(2 * i + 1), where + " value " + i);
        }
    }

    @Test
    void sameBytesAsSparksStreamsBothWaysWithAndWithoutUnsafe() {
        TestSeed seed = TestSeed.of("KryoStreamsTest");
        Random r = seed.random();
        for (boolean unsafe : new boolean[] {false, true}) {
            KryoSerializer s = new KryoSerializer(new SparkConf(false).set("spark.kryo.unsafe", Boolean.toString(unsafe)));
            SerializerInstance ser = s.newInstance();
            Kryo kryo = s.newKryo();
            for (int c = 0; c < CASES; c++) {
                String where = "seed " + seed + " unsafe " + unsafe + " case " + c;
                int count = r.nextInt(120);
                Object[] keys = new Object[count];
                Object[] values = new Object[count];
                for (int i = 0; i < count; i++) {
                    keys[i] = r.nextBoolean() ? (Object) r.nextLong() : "k" + r.nextInt(1000);
                    values[i] = KryoRecordsTest.value(r, i);
                }
                boolean flushEach = r.nextBoolean();
                ByteArrayOutputStream spark = new ByteArrayOutputStream();
                writeAll(ser.serializeStream(spark), keys, values, flushEach);
                ByteArrayOutputStream ours = new ByteArrayOutputStream();
                List<Kryo> back = new ArrayList<>();
                writeAll(KryoStreams.out(kryo, ours, unsafe, back::add), keys, values, flushEach);
                assertArrayEquals(spark.toByteArray(), ours.toByteArray(), where);
                assertEquals(List.of(kryo), back, where + ": given back once, at close");

                kryo.reset();
                assertRecords(keys, values, readAll(KryoStreams.in(kryo, new ByteArrayInputStream(spark.toByteArray()), unsafe)), where);
                assertRecords(keys, values, readAll(ser.deserializeStream(new ByteArrayInputStream(ours.toByteArray()))), where);
            }
        }
    }

    /** A value whose Java serialization throws: Kryo's JavaSerializer fails in the middle of the record. */
    static final class Explodes implements java.io.Serializable {
        private void writeObject(java.io.ObjectOutputStream o) {
            throw new IllegalStateException("boom");
        }
    }

    @Test
    void aFailedWriteKeepsTheKryoFromBeingGivenBack() {
        KryoSerializer s = new KryoSerializer(new SparkConf(false));
        Kryo kryo = s.newKryo();
        kryo.register(Explodes.class, new com.esotericsoftware.kryo.serializers.JavaSerializer());
        List<Kryo> back = new ArrayList<>();
        SerializationStream out = KryoStreams.out(kryo, new ByteArrayOutputStream(), false, back::add);
        out.writeKey(1, ANY);
        assertThrows(RuntimeException.class, () -> out.writeValue(new Explodes(), ANY));
        out.close();
        assertTrue(back.isEmpty(), "a Kryo that failed mid-object is not kept");
        out.close();
        assertFalse(back.contains(kryo));
    }
}
