// SlipstreamBlockResolver: Spark asks a ShuffleManager for a block resolver, used to serve shuffle
// blocks to other executors through the block manager. Slipstream's blocks never go that way
// (readers ask the daemon), so every request is refused with the reason.
package io.slipstream.spark.shuffle;

import org.apache.spark.network.buffer.ManagedBuffer;
import org.apache.spark.network.shuffle.MergedBlockMeta;
import org.apache.spark.shuffle.ShuffleBlockResolver;
import org.apache.spark.storage.BlockId;
import org.apache.spark.storage.ShuffleMergedBlockId;
import scala.Option;
import scala.collection.immutable.Seq;

final class SlipstreamBlockResolver implements ShuffleBlockResolver {
    private static UnsupportedOperationException refused(Object id) {
        return new UnsupportedOperationException("shuffle block " + id + " is served by the Slipstream daemon, not the block manager");
    }

    @Override
    public ManagedBuffer getBlockData(BlockId blockId, Option<String[]> dirs) {
        throw refused(blockId);
    }

    @Override
    public Seq<ManagedBuffer> getMergedBlockData(ShuffleMergedBlockId blockId, Option<String[]> dirs) {
        throw refused(blockId);
    }

    @Override
    public MergedBlockMeta getMergedBlockMeta(ShuffleMergedBlockId blockId, Option<String[]> dirs) {
        throw refused(blockId);
    }

    @Override
    public void stop() {}
}
