// HashOrderRelocationTest: HashOrder.relocatable (asked of the task's own serializer instance)
// answers as Spark's supportsRelocationOfSerializedObjects for Kryo with auto-reset on (the
// default), Kryo with a registrator that turns it off, and Java serialization — the writer and
// the reader decide on the order index with it, so a wrong answer misreads records.
package io.slipstream.spark.shuffle;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.esotericsoftware.kryo.Kryo;
import org.apache.spark.SparkConf;
import org.apache.spark.serializer.JavaSerializer;
import org.apache.spark.serializer.KryoRegistrator;
import org.apache.spark.serializer.KryoSerializer;
import org.apache.spark.serializer.Serializer;
import org.junit.jupiter.api.Test;

class HashOrderRelocationTest {
    /** A user registrator that turns Kryo's auto-reset off (records then may refer back). */
    public static final class NoAutoReset implements KryoRegistrator {
        @Override
        public void registerClasses(Kryo kryo) {
            kryo.setAutoReset(false);
        }
    }

    private static boolean spark(Serializer s) {
        return s.supportsRelocationOfSerializedObjects();
    }

    @Test
    void answersAsSparkForKryoWithAndWithoutAutoResetAndForJava() {
        Serializer kryo = new KryoSerializer(new SparkConf(false));
        assertTrue(HashOrder.relocatable(kryo, kryo.newInstance()));
        assertEquals(spark(new KryoSerializer(new SparkConf(false))), HashOrder.relocatable(kryo, kryo.newInstance()));

        SparkConf off = new SparkConf(false).set("spark.kryo.registrator", NoAutoReset.class.getName());
        Serializer noReset = new KryoSerializer(off);
        assertFalse(HashOrder.relocatable(noReset, noReset.newInstance()));
        assertEquals(spark(new KryoSerializer(off)), HashOrder.relocatable(noReset, noReset.newInstance()));

        Serializer java = new JavaSerializer(new SparkConf(false));
        assertFalse(HashOrder.relocatable(java, java.newInstance()));
    }
}
