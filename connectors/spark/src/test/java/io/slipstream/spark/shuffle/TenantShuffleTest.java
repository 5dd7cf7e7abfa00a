// A Spark application charged to a tenant (issue 17): the daemon has [[tenant]] entries with a
// shuffle_mb share; the job sets spark.slipstream.shuffle.tenant and gets the same results as
// Spark's sort shuffle, with its shuffle bytes counted (and charged) to its tenant only; an
// unknown tenant, or none, fails the SparkContext at start with the daemon's words. Runs in the
// "shuffle" surefire execution with the other shuffle manager tests.
package io.slipstream.spark.shuffle;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.util.List;
import java.util.Map;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.apache.spark.SparkConf;
import org.apache.spark.sql.SparkSession;
import org.junit.jupiter.api.Test;

class TenantShuffleTest {
    /** Two tenants; [shaping] wide enough that the buckets do not slow the test down. */
    static final String TENANTS = "[shaping]\ningress_bytes_per_s = 1000000000\negress_bytes_per_s = 1000000000\n"
            + "[[tenant]]\nname = \"spark\"\ntcp_port = %d\nshare = 0.5\nmemory_mb = 256\nshuffle_mb = 128\n"
            + "[[tenant]]\nname = \"other\"\ntcp_port = %d\nshare = 0.5\nmemory_mb = 128\nshuffle_mb = 64\n";

    static long metric(String text, String name, String tenant) {
        Matcher m = Pattern.compile("(?m)^" + name + "\\{tenant=\"" + tenant + "\"\\} (\\d+)$").matcher(text);
        assertTrue(m.find(), name + " for " + tenant + " in\n" + text);
        return Long.parseLong(m.group(1));
    }

    @Test
    void aTenantsJobGivesSparksResultsAndIsChargedToItsTenantOnly() throws IOException {
        String extra = String.format(TENANTS, ShuffleDaemon.freeTcp(), ShuffleDaemon.freeTcp());
        try (ShuffleDaemon daemon = new ShuffleDaemon(256, 64, extra)) {
            SparkSession sort = SlipstreamShuffleManagerTest.base().getOrCreate();
            Map<String, List<String>> expected = SlipstreamShuffleManagerTest.jobs(sort);
            sort.stop();
            SparkSession s = SlipstreamShuffleManagerTest.base()
                    .config("spark.shuffle.manager", SlipstreamShuffleManager.class.getName())
                    .config(SlipstreamShuffleManager.ENDPOINT, daemon.endpoint())
                    .config(SlipstreamShuffleManager.TENANT, "spark")
                    .getOrCreate();
            try {
                assertEquals(expected, SlipstreamShuffleManagerTest.jobs(s));
            } finally {
                s.stop();
            }
            String m = daemon.metrics();
            long in = metric(m, "slipstream_shuffle_tenant_bytes_in_total", "spark");
            long out = metric(m, "slipstream_shuffle_tenant_bytes_out_total", "spark");
            assertTrue(in > 0 && out >= in, "in " + in + " out " + out);
            assertEquals(0, metric(m, "slipstream_shuffle_tenant_bytes_in_total", "other"));
            // The application ended (UNREGISTER_APP): its blocks left the tenant's share.
            assertEquals(0, metric(m, "slipstream_shuffle_tenant_blocks_in_use", "spark"));

            SparkConf unknown = new SparkConf().set(SlipstreamShuffleManager.ENDPOINT, daemon.endpoint())
                    .set(SlipstreamShuffleManager.TENANT, "nope");
            IllegalStateException e = assertThrows(IllegalStateException.class, () -> new SlipstreamShuffleManager(unknown, true));
            assertTrue(e.getMessage().contains("unknown tenant \"nope\"") && e.getMessage().contains("spark, other"), e.getMessage());
            // Naming none on a daemon with tenants fails at start too, saying what to set.
            SparkConf none = new SparkConf().set(SlipstreamShuffleManager.ENDPOINT, daemon.endpoint());
            e = assertThrows(IllegalStateException.class, () -> new SlipstreamShuffleManager(none, true));
            assertTrue(e.getMessage().contains("set spark.slipstream.shuffle.tenant to one of spark, other"), e.getMessage());
        }
    }
}
