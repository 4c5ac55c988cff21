import com.alibaba.fastjson2.JSON;
import com.alibaba.fastjson2.JSONObject;
import java.io.BufferedReader;
import java.io.PrintWriter;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.Base64;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.rocketmq.common.BrokerConfig;
import org.apache.rocketmq.common.compression.CompressionType;
import org.apache.rocketmq.common.compression.CompressorFactory;
import org.apache.rocketmq.common.message.MessageDecoder;
import org.apache.rocketmq.common.message.MessageExtBrokerInner;
import org.apache.rocketmq.common.sysflag.MessageSysFlag;
import org.apache.rocketmq.store.AppendMessageResult;
import org.apache.rocketmq.store.DefaultMessageStore;
import org.apache.rocketmq.store.PutMessageResult;
import org.apache.rocketmq.store.config.MessageStoreConfig;
import org.apache.rocketmq.store.stats.BrokerStatsManager;

/**
 * Writes messages with RocketMQ's own message store (DefaultMessageStore, rocketmq-store from
 * Maven Central) so that the commit log and index files are the broker's real bytes, including
 * what a producer cannot ask a broker for: IPv6 born/store hosts and topics longer than 127
 * characters (stored with the v2 magic code).
 *
 * args: storeRoot commitLogFileSize maxHashSlotNum maxIndexNum specFile outFile
 * spec: one JSON object per line: topic, queueId, properties (map; KEYS, UNIQ_KEY, TAGS...),
 *   bodyB64, compress (LZ4/ZSTD/ZLIB or absent), bornV6, storeV6 (booleans), sleepMs (before the put)
 * out: one JSON object per line: offset, size, storeTimestamp, queueOffset
 */
public class StoreWriter {
    public static void main(String[] args) throws Exception {
        MessageStoreConfig config = new MessageStoreConfig();
        config.setStorePathRootDir(args[0]);
        config.setMappedFileSizeCommitLog(Integer.parseInt(args[1]));
        config.setMaxHashSlotNum(Integer.parseInt(args[2]));
        config.setMaxIndexNum(Integer.parseInt(args[3]));
        config.setMappedFileSizeConsumeQueue(20 * 1000);
        config.setHaListenPort(0);
        // as the test broker (harness.KEEP_EVERY_FILE): never delete or refuse because the disk looks full
        config.setCleanFileForciblyEnable(false);
        config.setDiskMaxUsedSpaceRatio(95);
        config.setDiskSpaceCleanForciblyRatio(99);
        config.setDiskSpaceWarningLevelRatio(99);
        config.setFileReservedTime(1000000);
        DefaultMessageStore store = new DefaultMessageStore(config, new BrokerStatsManager("storeWriter", true),
            null, new BrokerConfig(), new ConcurrentHashMap<>());
        if (!store.load()) {
            throw new IllegalStateException("store did not load");
        }
        store.start();
        InetSocketAddress v4 = new InetSocketAddress(InetAddress.getByName("127.0.0.1"), 10911);
        InetSocketAddress v6 = new InetSocketAddress(InetAddress.getByName("::1"), 10911);
        try (BufferedReader in = Files.newBufferedReader(Paths.get(args[4]), StandardCharsets.UTF_8);
             PrintWriter out = new PrintWriter(Files.newBufferedWriter(Paths.get(args[5]), StandardCharsets.UTF_8))) {
            String line;
            while ((line = in.readLine()) != null) {
                if (line.isEmpty()) {
                    continue;
                }
                JSONObject spec = JSON.parseObject(line);
                if (spec.getIntValue("sleepMs") > 0) {
                    Thread.sleep(spec.getIntValue("sleepMs"));
                }
                MessageExtBrokerInner msg = new MessageExtBrokerInner();
                msg.setTopic(spec.getString("topic"));
                msg.setQueueId(spec.getIntValue("queueId"));
                Map<String, String> properties = new LinkedHashMap<>();
                JSONObject given = spec.getJSONObject("properties");
                if (given != null) {
                    for (String name : given.keySet()) {
                        properties.put(name, given.getString(name));
                    }
                }
                for (Map.Entry<String, String> e : properties.entrySet()) {
                    org.apache.rocketmq.common.message.MessageAccessor.putProperty(msg, e.getKey(), e.getValue());
                }
                msg.setPropertiesString(MessageDecoder.messageProperties2String(msg.getProperties()));
                byte[] body = Base64.getDecoder().decode(spec.getString("bodyB64"));
                int sysFlag = 0;
                String compress = spec.getString("compress");
                if (compress != null) {
                    CompressionType type = CompressionType.of(compress);
                    body = CompressorFactory.getCompressor(type).compress(body, 5);
                    sysFlag |= MessageSysFlag.COMPRESSED_FLAG | type.getCompressionFlag();
                }
                msg.setBody(body);
                msg.setSysFlag(sysFlag);
                msg.setBornTimestamp(System.currentTimeMillis());
                msg.setBornHost(spec.getBooleanValue("bornV6") ? v6 : v4);
                msg.setStoreHost(spec.getBooleanValue("storeV6") ? v6 : v4);
                msg.setTagsCode(MessageExtBrokerInner.tagsString2tagsCode(msg.getTags()));
                PutMessageResult result = store.putMessage(msg);
                if (!result.isOk()) {
                    throw new IllegalStateException("put failed: " + result.getPutMessageStatus() + " for " + line);
                }
                AppendMessageResult append = result.getAppendMessageResult();
                JSONObject row = new JSONObject();
                row.put("offset", append.getWroteOffset());
                row.put("size", append.getWroteBytes());
                row.put("storeTimestamp", append.getStoreTimestamp());
                row.put("queueOffset", append.getLogicsOffset());
                out.println(row.toJSONString());
            }
        }
        long deadline = System.currentTimeMillis() + 60_000;
        while (store.dispatchBehindBytes() > 0 && System.currentTimeMillis() < deadline) {
            Thread.sleep(20);
        }
        if (store.dispatchBehindBytes() > 0) {
            throw new IllegalStateException("the store did not index every message in time");
        }
        store.shutdown();
        System.exit(0);
    }
}
