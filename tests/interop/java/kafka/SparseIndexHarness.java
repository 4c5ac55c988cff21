import java.io.BufferedReader;
import java.io.File;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.function.IntFunction;
import java.util.function.LongFunction;

import org.apache.kafka.storage.internals.log.AbstractIndex;
import org.apache.kafka.storage.internals.log.OffsetIndex;
import org.apache.kafka.storage.internals.log.OffsetPosition;
import org.apache.kafka.storage.internals.log.TimeIndex;
import org.apache.kafka.storage.internals.log.TimestampOffset;

/**
 * Drives Kafka's own OffsetIndex / TimeIndex for msgindex's interop tests. Reads one command per
 * line on stdin and answers one line per command on stdout, so that many scenarios share one
 * JVM launch:
 *
 *   WRITE_OFFSET path base maxIndexSize trim key value key value ...   (append(offset, position))
 *   WRITE_TIME   path base maxIndexSize trim key value key value ...   (maybeAppend(timestamp, offset))
 *   READ_OFFSET  path base target target ...
 *   READ_TIME    path base target target ...
 *
 * trim=1 closes the index (Kafka trims it to its entries), trim=0 flushes and unmaps it as a
 * killed broker would leave it. Answers: "OK" for writes; for reads
 * "OK entries=<n> entry=<k>:<v>,... lookup=<target>:<k>:<v>,..."; "ERR <exception class>" when
 * Kafka throws (sanityCheck failures included).
 */
public final class SparseIndexHarness {
    public static void main(String[] args) throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            if (line.isBlank()) continue;
            String[] words = line.trim().split(" ");
            try {
                System.out.println(run(words));
            } catch (Exception e) {
                System.out.println("ERR " + e.getClass().getSimpleName());
            }
        }
        System.out.flush();
    }

    private static String run(String[] w) throws Exception {
        File file = new File(w[1]);
        long base = Long.parseLong(w[2]);
        switch (w[0]) {
            case "WRITE_OFFSET": {
                OffsetIndex index = new OffsetIndex(file, base, Integer.parseInt(w[3]), true);
                try {
                    for (int i = 5; i + 1 < w.length; i += 2)
                        index.append(Long.parseLong(w[i]), Integer.parseInt(w[i + 1]));
                } finally {
                    finish(index, w[4]);
                }
                return "OK";
            }
            case "WRITE_TIME": {
                TimeIndex index = new TimeIndex(file, base, Integer.parseInt(w[3]), true);
                try {
                    for (int i = 5; i + 1 < w.length; i += 2)
                        index.maybeAppend(Long.parseLong(w[i]), Long.parseLong(w[i + 1]));
                } finally {
                    finish(index, w[4]);
                }
                return "OK";
            }
            case "READ_OFFSET": {
                OffsetIndex index = new OffsetIndex(file, base, -1, false);
                return describe(index, w,
                    n -> { OffsetPosition e = index.entry(n); return e.offset() + ":" + e.position(); },
                    t -> { OffsetPosition e = index.lookup(t); return e.offset() + ":" + e.position(); });
            }
            case "READ_TIME": {
                TimeIndex index = new TimeIndex(file, base, -1, false);
                return describe(index, w,
                    n -> { TimestampOffset e = index.entry(n); return e.timestamp() + ":" + e.offset(); },
                    t -> { TimestampOffset e = index.lookup(t); return e.timestamp() + ":" + e.offset(); });
            }
            default:
                throw new IllegalArgumentException("unknown command " + w[0]);
        }
    }

    /** sanityCheck, then every entry and the lookup of each target (words from index 3 on). */
    private static String describe(AbstractIndex index, String[] w, IntFunction<String> entry,
                                   LongFunction<String> lookup) {
        try {
            index.sanityCheck();
            List<String> entries = new ArrayList<>();
            for (int n = 0; n < index.entries(); n++)
                entries.add(entry.apply(n));
            List<String> lookups = new ArrayList<>();
            for (int i = 3; i < w.length; i++)
                lookups.add(w[i] + ":" + lookup.apply(Long.parseLong(w[i])));
            return "OK entries=" + index.entries() + " entry=" + String.join(",", entries)
                + " lookup=" + String.join(",", lookups);
        } finally {
            index.closeHandler();
        }
    }

    private static void finish(AbstractIndex index, String trim) throws Exception {
        if (trim.equals("1")) {
            index.close();
        } else {
            index.flush();
            index.closeHandler();
        }
    }
}
