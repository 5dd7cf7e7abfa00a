// KryoStreams: Spark's Kryo serialization and deserialization streams, byte for byte (the same
// Kryo calls, Output/Input classes and end-of-stream rule as KryoSerializationStream and
// KryoDeserializationStream), but with a Kryo the caller brings — the one the executor thread kept
// (ThreadKryo) — instead of one borrowed from the task's serializer instance. Each task
// deserializes its own copy of the shuffle dependency's serializer, whose Kryo pool starts empty,
// so every stream Spark opened in a task built a Kryo; a map task wrote one stream per partition
// and so built one Kryo per partition (session 20's PageRank profile: 9% of the task threads).
// The bytes are those of Spark's streams, so either side may be Spark's own. Not for: choosing
// when they apply (the writer and the reader decide) or other serializers.
package io.slipstream.spark.shuffle;

import com.esotericsoftware.kryo.Kryo;
import com.esotericsoftware.kryo.KryoException;
import com.esotericsoftware.kryo.io.Input;
import com.esotericsoftware.kryo.io.Output;
import com.esotericsoftware.kryo.io.UnsafeInput;
import com.esotericsoftware.kryo.io.UnsafeOutput;
import java.io.EOFException;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.util.Locale;
import java.util.function.Consumer;
import org.apache.spark.serializer.DeserializationStream;
import org.apache.spark.serializer.SerializationStream;
import scala.reflect.ClassTag;

final class KryoStreams {
    private KryoStreams() {}

    /** Writes objects to `out` with `kryo`, which goes to `giveBack` at close() (not if a write failed). */
    static SerializationStream out(Kryo kryo, OutputStream out, boolean unsafe, Consumer<Kryo> giveBack) {
        return new Out(kryo, unsafe ? new UnsafeOutput(out) : new Output(out), giveBack);
    }

    /** Reads objects from `in` with `kryo`, which the caller keeps (one Kryo reads many streams). */
    static DeserializationStream in(Kryo kryo, InputStream in, boolean unsafe) {
        return new In(kryo, unsafe ? new UnsafeInput(in) : new Input(in));
    }

    private static final class Out extends SerializationStream {
        private final Kryo kryo;
        private final Consumer<Kryo> giveBack;
        private Output output;
        private boolean failed;

        Out(Kryo kryo, Output output, Consumer<Kryo> giveBack) {
            this.kryo = kryo;
            this.output = output;
            this.giveBack = giveBack;
        }

        @Override
        public <T> SerializationStream writeObject(T t, ClassTag<T> tag) {
            try {
                kryo.writeClassAndObject(output, t);
            } catch (RuntimeException e) {
                // A Kryo that failed mid-object may hold half its state: it is not kept.
                failed = true;
                throw e;
            }
            return this;
        }

        @Override
        public void flush() {
            if (output == null) {
                throw SlipstreamShuffleReader.sneaky(new IOException("Stream is closed"));
            }
            output.flush();
        }

        @Override
        public void close() {
            if (output == null) {
                return;
            }
            try {
                output.close();
            } finally {
                output = null;
                if (!failed) {
                    giveBack.accept(kryo);
                }
            }
        }
    }

    private static final class In extends DeserializationStream {
        private final Kryo kryo;
        private Input input;

        In(Kryo kryo, Input input) {
            this.kryo = kryo;
            this.input = input;
        }

        @Override
        @SuppressWarnings("unchecked")
        public <T> T readObject(ClassTag<T> tag) {
            try {
                return (T) kryo.readClassAndObject(input);
            } catch (KryoException e) {
                // Spark's own stopping rule: its iterators take EOFException as the end of the stream.
                if (String.valueOf(e.getMessage()).toLowerCase(Locale.ROOT).contains("buffer underflow")) {
                    throw SlipstreamShuffleReader.sneaky(new EOFException());
                }
                throw e;
            }
        }

        @Override
        public void close() {
            if (input != null) {
                input.close();
                input = null;
            }
        }
    }
}
