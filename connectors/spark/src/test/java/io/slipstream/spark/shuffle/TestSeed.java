// TestSeed: the one place a randomized test here gets its seed — `-Dslipstream.seed=N` to rerun
// a failure, else the clock — prints it (the rule: randomized tests print their seed) and makes
// the Random from it. Not for: choosing what the test generates.
package io.slipstream.spark.shuffle;

import java.util.Random;

record TestSeed(long value, Random random) {
    /** The seed for `test` (named in the printed line), printed, and a Random made from it. */
    static TestSeed of(String test) {
        long seed = Long.getLong("slipstream.seed", System.nanoTime());
        System.out.println(test + " seed " + seed + " (rerun with -Dslipstream.seed=" + seed + ")");
        return new TestSeed(seed, new Random(seed));
    }

    /** The number alone, for assertion messages ("seed " + seed). */
    @Override
    public String toString() {
        return Long.toString(value);
    }
}
