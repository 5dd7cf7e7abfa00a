// ThreadKryoTest: a Kryo kept by one reduce task's thread (ThreadKryo) goes only to a later task
// on the same thread whose serializer would build an equal Kryo — every KryoSerializer setting
// and the class loader (default loader or the thread's context loader) — once per give, reset;
// subclasses and other serializers are never kept; HashOrder's relocation answer and HashMerge's
// give-back use it. Tasks deserialize their own serializer copy: simulated by Java serialization.
package io.slipstream.spark.shuffle;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.esotericsoftware.kryo.Kryo;
import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.ObjectInputStream;
import java.io.ObjectOutputStream;
import java.net.URL;
import java.net.URLClassLoader;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.atomic.AtomicReference;
import org.apache.spark.SparkConf;
import org.apache.spark.serializer.JavaSerializer;
import org.apache.spark.serializer.KryoSerializer;
import org.apache.spark.serializer.Serializer;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

class ThreadKryoTest {
    @AfterEach
    void emptySlot() {
        ThreadKryo.Key k = ThreadKryo.key(new KryoSerializer(new SparkConf(false)));
        for (int i = 0; i < ThreadKryo.KEPT_MAX && ThreadKryo.take(k) != null; i++) {
            // a test may leave up to KEPT_MAX kept
        }
    }

    @Test
    void theSlotKeepsUpToKeptMaxAndOneKeyAtATime() {
        KryoSerializer s = kryo();
        ThreadKryo.Key key = ThreadKryo.key(s);
        List<Kryo> given = new ArrayList<>();
        for (int i = 0; i <= ThreadKryo.KEPT_MAX; i++) {
            given.add(s.newKryo());
            ThreadKryo.give(key, given.get(i));
        }
        // Last kept first; the one beyond KEPT_MAX was dropped.
        for (int i = ThreadKryo.KEPT_MAX - 1; i >= 0; i--) {
            assertSame(given.get(i), ThreadKryo.take(key));
        }
        assertNull(ThreadKryo.take(key));
        // A Kryo kept for other settings drops what was kept for these.
        ThreadKryo.give(key, given.get(0));
        KryoSerializer other = kryo("spark.kryo.referenceTracking", "false");
        Kryo o = other.newKryo();
        ThreadKryo.give(ThreadKryo.key(other), o);
        assertNull(ThreadKryo.take(key));
        assertSame(o, ThreadKryo.take(ThreadKryo.key(other)));
    }

    /** The copy a task gets: the serializer Java-serialized and read back. */
    static Serializer copy(Serializer s) throws Exception {
        ByteArrayOutputStream b = new ByteArrayOutputStream();
        try (ObjectOutputStream o = new ObjectOutputStream(b)) {
            o.writeObject(s);
        }
        try (ObjectInputStream i = new ObjectInputStream(new ByteArrayInputStream(b.toByteArray()))) {
            return (Serializer) i.readObject();
        }
    }

    static KryoSerializer kryo(String... kv) {
        SparkConf c = new SparkConf(false);
        for (int i = 0; i < kv.length; i += 2) {
            c.set(kv[i], kv[i + 1]);
        }
        return new KryoSerializer(c);
    }

    @Test
    void aKeptKryoGoesOnceToAnEqualSerializerOnTheSameThreadReset() throws Exception {
        KryoSerializer s = kryo();
        Kryo k = s.newKryo();
        k.getGraphContext().put("left over", 1);
        ThreadKryo.give(ThreadKryo.key(s), k);
        ThreadKryo.Key taskKey = ThreadKryo.key(copy(s));
        long before = ThreadKryo.taken();
        assertSame(k, ThreadKryo.take(taskKey));
        assertEquals(before + 1, ThreadKryo.taken());
        assertTrue(k.getGraphContext() == null || k.getGraphContext().size == 0, "reset on take");
        assertNull(ThreadKryo.take(taskKey), "one holder at a time");
    }

    @Test
    void otherSettingsLoadersAndThreadsGetNone() throws Exception {
        KryoSerializer s = kryo();
        Kryo k = s.newKryo();
        ThreadKryo.give(ThreadKryo.key(s), k);
        List<Serializer> others = new ArrayList<>();
        others.add(kryo("spark.kryo.registrationRequired", "true"));
        others.add(kryo("spark.kryo.referenceTracking", "false"));
        others.add(kryo("spark.kryo.registrator", HashOrderRelocationTest.NoAutoReset.class.getName()));
        others.add(kryo("spark.kryo.classesToRegister", "java.util.ArrayList"));
        others.add(kryo("spark.kryo.unsafe", "false"));  // true is Spark 4's default
        others.add(kryo("spark.kryoserializer.buffer", "128k"));
        for (Serializer o : others) {
            assertNull(ThreadKryo.take(ThreadKryo.key(copy(o))), ThreadKryo.key(o) + " vs " + ThreadKryo.key(s));
        }
        // Another class loader: as the serializer's default, or as the thread's context loader.
        try (URLClassLoader other = new URLClassLoader(new URL[0], getClass().getClassLoader())) {
            assertNull(ThreadKryo.take(ThreadKryo.key(copy(s).setDefaultClassLoader(other))));
            ClassLoader was = Thread.currentThread().getContextClassLoader();
            Thread.currentThread().setContextClassLoader(other);
            try {
                assertNull(ThreadKryo.take(ThreadKryo.key(copy(s))));
            } finally {
                Thread.currentThread().setContextClassLoader(was);
            }
        }
        AtomicReference<Object> elsewhere = new AtomicReference<>("unset");
        Thread t = new Thread(() -> {
            try {
                elsewhere.set(ThreadKryo.take(ThreadKryo.key(copy(s))));
            } catch (Exception e) {
                elsewhere.set(e);
            }
        });
        t.start();
        t.join(10_000);
        assertNull(elsewhere.get(), "another thread");
        // None of the misses took it.
        assertSame(k, ThreadKryo.take(ThreadKryo.key(copy(s))));
    }

    @Test
    void onlyKryoSerializerItselfIsKept() {
        assertNull(ThreadKryo.key(new JavaSerializer(new SparkConf(false))));
        assertNull(ThreadKryo.key(new KryoSerializer(new SparkConf(false)) {}));
        assertNotNull(ThreadKryo.key(kryo()));
        ThreadKryo.give(null, new Kryo());
        assertNull(ThreadKryo.take(null));
    }

    @Test
    void relocationIsAskedOfTheKeptKryo() {
        KryoSerializer s = kryo();
        Kryo on = s.newKryo();
        Kryo off = s.newKryo();
        off.setAutoReset(false);
        assertTrue(HashOrder.relocatable(s, s.newInstance(), on));
        assertFalse(HashOrder.relocatable(s, s.newInstance(), off));
        assertFalse(HashOrder.relocatable(new JavaSerializer(new SparkConf(false)), null, null));
    }

    static org.apache.spark.Aggregator<Object, Object, Object> count() {
        return new org.apache.spark.Aggregator<>(v -> 1, (c, v) -> (Integer) c + 1, (a, b) -> (Integer) a + (Integer) b);
    }

    @Test
    void theMergeReadsWithTheKeptKryoAndGivesItBackOnceAllIsRead() {
        TestSeed seed = TestSeed.of("ThreadKryoTest");
        java.util.Random r = seed.random();
        KryoSerializer s = kryo();
        org.apache.spark.serializer.SerializerInstance ser = s.newInstance();
        HashOrder.Builder index = new HashOrder.Builder();
        KryoRecordsTest.Written w = KryoRecordsTest.write(r, ser, 1 + r.nextInt(50), index);
        byte[] idx = index.finish();
        byte[] all = new byte[w.bytes().length + idx.length];
        System.arraycopy(w.bytes(), 0, all, 0, w.bytes().length);
        System.arraycopy(idx, 0, all, w.bytes().length, idx.length);
        Kryo kept = s.newKryo();
        List<Kryo> back = new ArrayList<>();
        HashMerge m = new HashMerge(List.of(new HashMerge.Source(HashMergeCursorTest.split(r, all, r.nextInt(4)), () -> {})),
                ser, kept, back::add, count(), false, n -> {});
        assertTrue(back.isEmpty(), "kept while records are left");
        int records = 0;
        while (m.hasNext()) {
            records += (Integer) m.next()._2();
        }
        assertEquals(w.keys().length, records, seed.toString());
        assertEquals(List.of(kept), back, seed.toString());
        assertFalse(m.hasNext());
        assertEquals(List.of(kept), back, "once: " + seed);
        // No source (an empty partition): given back at once.
        back.clear();
        new HashMerge(List.of(), ser, kept, back::add, count(), false, n -> {});
        assertEquals(List.of(kept), back);
    }
}
