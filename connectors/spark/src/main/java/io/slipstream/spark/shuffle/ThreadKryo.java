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
// gets this one's Kryo). One holder at a time: take() empties the thread's slot, give() fills it,
// so two merges interleaved on one thread never share a Kryo; a task that fails mid-read never
// gives its Kryo back. Not for: map tasks (their Kryo lives inside Spark's serialization stream),
// serializers other than KryoSerializer itself (a subclass may build differently).
package io.slipstream.spark.shuffle;

import com.esotericsoftware.kryo.Kryo;
import java.lang.reflect.Field;
import java.lang.reflect.Modifier;
import java.util.ArrayList;
import java.util.List;
import org.apache.spark.serializer.KryoSerializer;
import org.apache.spark.serializer.Serializer;
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

    /** The thread's kept Kryo and the key it was built for (one slot per thread). */
    private static final ThreadLocal<Object[]> SLOT = ThreadLocal.withInitial(() -> new Object[2]);

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

    /** The thread's kept Kryo if it was built for `key` (reset, and no longer kept), else null. */
    static Kryo take(Key key) {
        if (key == null) {
            return null;
        }
        Object[] slot = SLOT.get();
        if (slot[1] == null || !key.equals(slot[0])) {
            return null;
        }
        Kryo k = (Kryo) slot[1];
        slot[0] = null;
        slot[1] = null;
        // As Spark's pool does on every borrow: no state of the last use carries over.
        k.reset();
        TAKEN.increment();
        return k;
    }

    /** Keeps `kryo` (built for `key`) for the thread's next take; replaces what was kept. */
    static void give(Key key, Kryo kryo) {
        if (key == null || kryo == null) {
            return;
        }
        Object[] slot = SLOT.get();
        slot[0] = key;
        slot[1] = kryo;
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
