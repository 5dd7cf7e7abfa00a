// ThreadKryo: one Kryo kept per executor thread from one reduce task's merge to the next, for
// Spark's KryoSerializer exactly. Each task deserializes its own copy of the shuffle dependency's
// serializer, whose Kryo pool starts empty, so every reduce task built a Kryo (registrations,
// Chill's Scala serializers, the user's registrator): 8.8% of a 200x200 reduce task (session 16's
// profile). Spark keeps its own SparkEnv serializer's Kryos across tasks the same way (one pool
// per executor); this does it for the dependency's copies.
//
// A kept Kryo is handed only to a serializer that would build an equal one: the key is every
// setting KryoSerializer holds (its non-transient fields, read by reflection, so a field a later
// Spark adds is part of the key too; a field without value equality only makes the key never
// match) and the class loader newKryo would use (the serializer's default loader, else the
// thread's context loader, compared by identity: another application's or session's loader never
// gets this one's Kryo). One holder per Kryo: take() removes it from the thread's slot, give()
// puts it back, so two users on one thread never share a Kryo; a task that fails mid-read or
// mid-write never gives its Kryo back. The slot keeps up to KEPT_MAX: a task that reads one
// shuffle and writes the next (a GraphX iteration's middle stage) holds two at once, and map tasks
// take theirs here too (session 20's PageRank profile: Kryos built in map tasks' serialization
// streams, one per partition, were 9% of the task threads). Not for: serializers other than
// KryoSerializer itself (a subclass may build differently).
package io.slipstream.spark.shuffle;

import com.esotericsoftware.kryo.Kryo;
import java.lang.reflect.Field;
import java.lang.reflect.Modifier;
import java.util.ArrayList;
import java.util.List;
import org.apache.spark.serializer.KryoSerializer;
import org.apache.spark.serializer.KryoSerializerInstance;
import org.apache.spark.serializer.Serializer;
import org.apache.spark.serializer.SerializerInstance;
import scala.Option;

final class ThreadKryo {
    private ThreadKryo() {}

    /** What a Kryo built by a serializer depends on: its settings and the class loader it resolves names with. */
    record Key(List<Object> settings, ClassLoader loader) {
        @Override
        public boolean equals(Object o) {
            return o instanceof Key k && k.loader == loader && k.settings.equals(settings);
        }

        @Override
        public int hashCode() {
            return settings.hashCode() * 31 + System.identityHashCode(loader);
        }
    }

    /** KryoSerializer's settings fields; null if they cannot be read. */
    private static final Field[] SETTINGS = settingsFields();
    /** Kryo's autoReset (no getter in Kryo 4; Spark reads it the same way). */
    private static final Field AUTO_RESET = field(Kryo.class, "autoReset");

    /** How many take()s found a kept Kryo (each one a Kryo not built); for tests. */
    private static final java.util.concurrent.atomic.LongAdder TAKEN = new java.util.concurrent.atomic.LongAdder();

    /** Kryos kept per thread: a reader and a writer of one task each hold one. */
    static final int KEPT_MAX = 2;

    /** KryoSerializerInstance's useUnsafe (private: read once by reflection; null if it cannot be). */
    private static final Field USE_UNSAFE = useUnsafeField();

    /** The thread's kept Kryos, all built for `key`. */
    private static final class Slot {
        Key key;
        final Kryo[] kept = new Kryo[KEPT_MAX];
        int n;
    }

    private static final ThreadLocal<Slot> SLOT = ThreadLocal.withInitial(Slot::new);

    /** `s`'s key, or null when its Kryos are not kept (not KryoSerializer itself, or reflection refused). */
    static Key key(Serializer s) {
        if (s.getClass() != KryoSerializer.class || SETTINGS == null || AUTO_RESET == null) {
            return null;
        }
        try {
            List<Object> values = new ArrayList<>(SETTINGS.length);
            for (Field f : SETTINGS) {
                values.add(f.get(s));
            }
            Option<ClassLoader> dflt = s.defaultClassLoader();
            ClassLoader loader = dflt.isDefined() ? dflt.get() : Thread.currentThread().getContextClassLoader();
            return new Key(values, loader);
        } catch (ReflectiveOperationException | RuntimeException e) {
            return null;
        }
    }

    /** A Kryo the thread kept for `key` (reset, and no longer kept), else null. */
    static Kryo take(Key key) {
        if (key == null) {
            return null;
        }
        Slot slot = SLOT.get();
        if (slot.n == 0 || !key.equals(slot.key)) {
            return null;
        }
        Kryo k = slot.kept[--slot.n];
        slot.kept[slot.n] = null;
        // As Spark's pool does on every borrow: no state of the last use carries over.
        k.reset();
        TAKEN.increment();
        return k;
    }

    /**
     * A Kryo for `ser` (an instance of the serializer `key` was made for): the thread's kept one,
     * else one borrowed from `ser`'s own pool (which builds it).
     */
    static Kryo takeOrBorrow(Key key, KryoSerializerInstance ser) {
        return orBorrow(take(key), ser);
    }

    /** `kept` (a Kryo already taken for `ser`'s settings) if not null, else one borrowed from `ser`'s pool. */
    static Kryo orBorrow(Kryo kept, KryoSerializerInstance ser) {
        return kept != null ? kept : ser.borrowKryo();
    }

    /**
     * Keeps `kryo` (built for `key`) for the thread's next take. Kryos kept for another key are
     * dropped first (one application's settings at a time); beyond KEPT_MAX it is dropped.
     */
    static void give(Key key, Kryo kryo) {
        if (key == null || kryo == null) {
            return;
        }
        Slot slot = SLOT.get();
        if (!key.equals(slot.key)) {
            java.util.Arrays.fill(slot.kept, null);
            slot.n = 0;
            slot.key = key;
        }
        if (slot.n < KEPT_MAX) {
            slot.kept[slot.n++] = kryo;
        }
    }

    /** `ser`'s useUnsafe if it is Spark's KryoSerializerInstance itself (not a subclass), else null. */
    static Boolean useUnsafe(SerializerInstance ser) {
        if (ser.getClass() != KryoSerializerInstance.class || USE_UNSAFE == null) {
            return null;
        }
        try {
            return USE_UNSAFE.getBoolean(ser);
        } catch (IllegalAccessException e) {
            return null;
        }
    }

    private static Field useUnsafeField() {
        Field f = field(KryoSerializerInstance.class, "useUnsafe");
        return f != null && f.getType() == boolean.class ? f : null;
    }

    /** How many take()s so far (all threads) found a kept Kryo. */
    static long taken() {
        return TAKEN.sum();
    }

    /** Whether `kryo` resets after each object (KryoSerializerInstance.getAutoReset, without a new Kryo). */
    static boolean autoReset(Kryo kryo) {
        try {
            return AUTO_RESET.getBoolean(kryo);
        } catch (IllegalAccessException e) {
            // Unreachable: key() hands out no key (so no kept Kryo) when the field is not accessible.
            throw new IllegalStateException(e);
        }
    }

    private static Field[] settingsFields() {
        try {
            List<Field> out = new ArrayList<>();
            for (Field f : KryoSerializer.class.getDeclaredFields()) {
                int m = f.getModifiers();
                // Lazy vals' caches and bitmaps (names with '$', supportsRelocation...) are derived, not settings.
                if (Modifier.isStatic(m) || Modifier.isTransient(m) || f.isSynthetic() || f.getName().contains("$")
                        || f.getName().equals("supportsRelocationOfSerializedObjects")) {
                    continue;
                }
                f.setAccessible(true);
                out.add(f);
            }
            return out.isEmpty() ? null : out.toArray(Field[]::new);
        } catch (RuntimeException e) {
            return null;
        }
    }

    private static Field field(Class<?> c, String name) {
        try {
            Field f = c.getDeclaredField(name);
            f.setAccessible(true);
            return f;
        } catch (ReflectiveOperationException | RuntimeException e) {
            return null;
        }
    }
}
