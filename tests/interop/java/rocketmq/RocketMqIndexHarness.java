import java.io.BufferedReader;
import java.io.File;
import java.io.IOException;
import java.io.PrintWriter;
import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import org.apache.rocketmq.store.index.IndexFile;

/**
 * Drives RocketMQ's own IndexFile (rocketmq-store from Maven Central) from a command script, so
 * msgindex's tests and benchmark can compare against the real implementation in one JVM launch.
 *
 * Script lines (tab-separated; keys are hex of their UTF-16 code units, 4 digits per unit, "-" for
 * the empty key, so any Java String including lone surrogates survives the trip):
 *   create PATH SLOTS NUM END_PHY END_TS   new file (becomes the current one)
 *   open PATH SLOTS NUM                    existing file: constructor with 0, 0 then load()
 *   put KEY PHY TS                         putKey; prints "put true|false"
 *   query KEY MAX BEGIN END                selectPhyOffset; prints "query o1,o2,..."
 *   close                                  shutdown() (flush + unmap), as a broker does
 *   bench_put KEYFILE SLOTS NUM DIR WARMUP ROUNDS     prints "bench_put wall <entries/s per round> cpu <...>"
 *   bench_query PATH SLOTS NUM KEYFILE MAX BEGIN END  prints "bench_query <p50 ns> <p99 ns> <hits>"
 * Bench key files are UTF-8, one key per line; key i is put at phyOffset i, timestamp BASE + i ms.
 */
public final class RocketMqIndexHarness {
    static final long BENCH_BASE_TS = 1_700_000_000_000L;

    public static void main(String[] args) throws Exception {
        if (args.length != 2) {
            System.err.println("usage: RocketMqIndexHarness SCRIPT OUTPUT");
            System.exit(2);
        }
        IndexFile current = null;
        try (BufferedReader in = Files.newBufferedReader(Paths.get(args[0]), StandardCharsets.UTF_8);
             PrintWriter out = new PrintWriter(Files.newBufferedWriter(Paths.get(args[1]), StandardCharsets.UTF_8))) {
            String line;
            while ((line = in.readLine()) != null) {
                if (line.isEmpty()) {
                    continue;
                }
                String[] f = line.split("\t", -1);
                switch (f[0]) {
                    case "create":
                        current = new IndexFile(f[1], Integer.parseInt(f[2]), Integer.parseInt(f[3]),
                            Long.parseLong(f[4]), Long.parseLong(f[5]));
                        break;
                    case "open":
                        current = new IndexFile(f[1], Integer.parseInt(f[2]), Integer.parseInt(f[3]), 0L, 0L);
                        current.load();
                        break;
                    case "put":
                        out.println("put " + current.putKey(decodeKey(f[1]), Long.parseLong(f[2]), Long.parseLong(f[3])));
                        break;
                    case "query": {
                        List<Long> found = new ArrayList<>();
                        current.selectPhyOffset(found, decodeKey(f[1]), Integer.parseInt(f[2]),
                            Long.parseLong(f[3]), Long.parseLong(f[4]));
                        StringBuilder sb = new StringBuilder("query ");
                        for (int i = 0; i < found.size(); i++) {
                            sb.append(i == 0 ? "" : ",").append(found.get(i));
                        }
                        out.println(sb);
                        break;
                    }
                    case "close":
                        current.shutdown();
                        current = null;
                        break;
                    case "bench_put":
                        out.println(benchPut(f[1], Integer.parseInt(f[2]), Integer.parseInt(f[3]), f[4],
                            Integer.parseInt(f[5]), Integer.parseInt(f[6])));
                        break;
                    case "bench_query":
                        out.println(benchQuery(f[1], Integer.parseInt(f[2]), Integer.parseInt(f[3]), f[4],
                            Integer.parseInt(f[5]), Long.parseLong(f[6]), Long.parseLong(f[7])));
                        break;
                    default:
                        throw new IllegalArgumentException("unknown command: " + f[0]);
                }
                out.flush();
            }
        }
        System.exit(0);  // RocketMQ's store leaves non-daemon threads behind
    }

    static String decodeKey(String hex) {
        if (hex.equals("-")) {
            return "";
        }
        char[] units = new char[hex.length() / 4];
        for (int i = 0; i < units.length; i++) {
            units[i] = (char) Integer.parseInt(hex.substring(4 * i, 4 * i + 4), 16);
        }
        return new String(units);
    }

    /** Keys as UTF-8 bytes; turned into fresh Strings before each timed round so that every
     * round pays for String.hashCode (Java caches it per String object). */
    static byte[][] readKeyBytes(String keyFile) throws IOException {
        List<String> lines = Files.readAllLines(Paths.get(keyFile), StandardCharsets.UTF_8);
        byte[][] keys = new byte[lines.size()][];
        for (int i = 0; i < keys.length; i++) {
            keys[i] = lines.get(i).getBytes(StandardCharsets.UTF_8);
        }
        return keys;
    }

    static String[] freshStrings(byte[][] keys) {
        String[] strings = new String[keys.length];
        for (int i = 0; i < keys.length; i++) {
            strings[i] = new String(keys[i], StandardCharsets.UTF_8);
        }
        return strings;
    }

    static String benchPut(String keyFile, int slots, int num, String dir, int warmup, int rounds) throws IOException {
        byte[][] keys = readKeyBytes(keyFile);
        ThreadMXBean threads = ManagementFactory.getThreadMXBean();
        StringBuilder wall = new StringBuilder(" wall");
        StringBuilder cpu = new StringBuilder(" cpu");
        for (int round = 0; round < warmup + rounds; round++) {
            String[] strings = freshStrings(keys);
            // DefaultMappedFile parses the file name as a number (RocketMQ names files by offset or time).
            File file = new File(dir, String.format("%017d", round));
            IndexFile index = new IndexFile(file.getPath(), slots, num, 0L, 0L);
            long start = System.nanoTime();
            long cpuStart = threads.getCurrentThreadCpuTime();
            int written = 0;
            for (int i = 0; i < strings.length; i++) {
                if (index.putKey(strings[i], i, BENCH_BASE_TS + i)) {
                    written++;
                }
            }
            long cpuElapsed = threads.getCurrentThreadCpuTime() - cpuStart;
            long elapsed = System.nanoTime() - start;
            index.shutdown();
            index.destroy(0);
            file.delete();
            if (round >= warmup) {
                wall.append(' ').append((long) (written / (elapsed / 1e9)));
                cpu.append(' ').append((long) (written / (cpuElapsed / 1e9)));
            }
        }
        return "bench_put" + wall + cpu;
    }

    static String benchQuery(String path, int slots, int num, String keyFile, int maxNum, long begin, long end) throws IOException {
        IndexFile index = new IndexFile(path, slots, num, 0L, 0L);
        index.load();
        byte[][] keys = readKeyBytes(keyFile);
        // Warm-up pass on separate String objects (JIT and page cache), then one timed call per key.
        for (String key : freshStrings(keys)) {
            index.selectPhyOffset(new ArrayList<>(), key, maxNum, begin, end);
        }
        String[] strings = freshStrings(keys);
        long[] nanos = new long[strings.length];
        long hits = 0;
        for (int i = 0; i < strings.length; i++) {
            List<Long> found = new ArrayList<>();
            long start = System.nanoTime();
            index.selectPhyOffset(found, strings[i], maxNum, begin, end);
            nanos[i] = System.nanoTime() - start;
            hits += found.size();
        }
        Arrays.sort(nanos);
        return "bench_query " + nanos[nanos.length / 2] + " " + nanos[(int) (nanos.length * 0.99)] + " " + hits;
    }
}
