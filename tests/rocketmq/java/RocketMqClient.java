import com.alibaba.fastjson2.JSON;
import com.alibaba.fastjson2.JSONArray;
import com.alibaba.fastjson2.JSONObject;
import java.io.BufferedReader;
import java.io.PrintWriter;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Base64;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import org.apache.rocketmq.client.consumer.DefaultMQPullConsumer;
import org.apache.rocketmq.client.consumer.PullResult;
import org.apache.rocketmq.client.consumer.PullStatus;
import org.apache.rocketmq.client.exception.MQClientException;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.SendStatus;
import org.apache.rocketmq.client.QueryResult;
import org.apache.rocketmq.common.compression.CompressionType;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;
import org.apache.rocketmq.remoting.protocol.ResponseCode;
import org.apache.rocketmq.tools.admin.DefaultMQAdminExt;

/**
 * The test's RocketMQ client (rocketmq-client / rocketmq-tools from Maven Central). One JVM runs
 * one command:
 *
 *   produce NAMESRV SPEC OUT     send the messages of SPEC (JSON lines: topic, keys, tags,
 *                                bodyB64, properties, batch, compress, sleepMs); consecutive messages with
 *                                the same non-null batch id go in one batch send. OUT: per
 *                                message msgId, offsetMsgId, queueId, queueOffset.
 *   bulk NAMESRV TOPIC COUNT KEYS BATCH OUT
 *                                COUNT small messages in batches of BATCH, message i with keys
 *                                "k<i % KEYS>" and "m<i>"; OUT: one JSON line with the count sent.
 *   pull NAMESRV TOPICS OUT      every message of the comma-separated TOPICS, read queue by
 *                                queue with a pull consumer (the broker's consume queues).
 *   query NAMESRV QUERIES OUT    for each JSON line (topic, key, maxNum, begin, end) the admin
 *                                API's queryMessage answer: the commit-log offsets it returned.
 *   bench NAMESRV QUERIES ROUNDS OUT
 *                                the same queries ROUNDS times, timed; OUT: queries, seconds.
 */
public class RocketMqClient {
    public static void main(String[] args) throws Exception {
        String command = args[0];
        String namesrv = args[1];
        switch (command) {
            case "produce": produce(namesrv, args[2], args[3]); break;
            case "bulk": bulk(namesrv, args[2], Integer.parseInt(args[3]), Integer.parseInt(args[4]), Integer.parseInt(args[5]), args[6]); break;
            case "pull": pull(namesrv, args[2], args[3]); break;
            case "query": query(namesrv, args[2], args[3]); break;
            case "bench": bench(namesrv, args[2], Integer.parseInt(args[3]), args[4]); break;
            default: throw new IllegalArgumentException("unknown command " + command);
        }
        System.exit(0);
    }

    private static DefaultMQProducer producer(String namesrv) throws MQClientException {
        DefaultMQProducer producer = new DefaultMQProducer("msgindex_test_producer");
        producer.setNamesrvAddr(namesrv);
        producer.setSendMsgTimeout(15000);
        producer.setRetryTimesWhenSendFailed(4);
        producer.start();
        return producer;
    }

    private static Message message(JSONObject spec) {
        Message msg = new Message(spec.getString("topic"), Base64.getDecoder().decode(spec.getString("bodyB64")));
        if (spec.getString("keys") != null) {
            msg.setKeys(spec.getString("keys"));
        }
        if (spec.getString("tags") != null) {
            msg.setTags(spec.getString("tags"));
        }
        JSONObject properties = spec.getJSONObject("properties");
        if (properties != null) {
            for (String name : properties.keySet()) {
                msg.putUserProperty(name, properties.getString(name));
            }
        }
        return msg;
    }

    private static JSONObject sent(SendResult result) {
        if (result.getSendStatus() != SendStatus.SEND_OK) {
            throw new IllegalStateException("send failed: " + result);
        }
        JSONObject row = new JSONObject();
        row.put("msgId", result.getMsgId());
        row.put("offsetMsgId", result.getOffsetMsgId());
        row.put("queueId", result.getMessageQueue().getQueueId());
        row.put("queueOffset", result.getQueueOffset());
        return row;
    }

    private static void produce(String namesrv, String specFile, String outFile) throws Exception {
        DefaultMQProducer producer = producer(namesrv);
        List<JSONObject> specs = new ArrayList<>();
        try (BufferedReader in = Files.newBufferedReader(Paths.get(specFile), StandardCharsets.UTF_8)) {
            String line;
            while ((line = in.readLine()) != null) {
                if (!line.isEmpty()) {
                    specs.add(JSON.parseObject(line));
                }
            }
        }
        try (PrintWriter out = new PrintWriter(Files.newBufferedWriter(Paths.get(outFile), StandardCharsets.UTF_8))) {
            int i = 0;
            while (i < specs.size()) {
                JSONObject spec = specs.get(i);
                if (spec.getIntValue("sleepMs") > 0) {
                    Thread.sleep(spec.getIntValue("sleepMs"));  // spreads store times over seconds
                }
                Object batch = spec.get("batch");
                if (batch == null) {
                    String compress = spec.getString("compress");
                    producer.setCompressType(CompressionType.of(compress == null ? "ZLIB" : compress));
                    out.println(sent(producer.send(message(spec))).toJSONString());
                    i++;
                    continue;
                }
                List<Message> messages = new ArrayList<>();
                int j = i;
                while (j < specs.size() && batch.equals(specs.get(j).get("batch"))) {
                    messages.add(message(specs.get(j)));
                    j++;
                }
                SendResult result = producer.send(messages);
                if (result.getSendStatus() != SendStatus.SEND_OK) {
                    throw new IllegalStateException("batch send failed: " + result);
                }
                String[] ids = result.getMsgId().split(",");
                String[] offsetIds = result.getOffsetMsgId().split(",");
                for (int k = 0; k < messages.size(); k++) {
                    JSONObject row = new JSONObject();
                    row.put("msgId", ids[k]);
                    row.put("offsetMsgId", offsetIds[k]);
                    row.put("queueId", result.getMessageQueue().getQueueId());
                    row.put("queueOffset", result.getQueueOffset() + k);
                    out.println(row.toJSONString());
                }
                i = j;
            }
        }
        producer.shutdown();
    }

    private static void bulk(String namesrv, String topic, int count, int keys, int batch, String outFile) throws Exception {
        DefaultMQProducer producer = producer(namesrv);
        byte[] body = new byte[32];
        int sent = 0;
        while (sent < count) {
            List<Message> messages = new ArrayList<>();
            for (int k = 0; k < batch && sent + k < count; k++) {
                int i = sent + k;
                Message msg = new Message(topic, body);
                msg.setKeys("k" + (i % keys) + " m" + i);
                messages.add(msg);
            }
            SendResult result = producer.send(messages);
            if (result.getSendStatus() != SendStatus.SEND_OK) {
                throw new IllegalStateException("batch send failed: " + result);
            }
            sent += messages.size();
        }
        producer.shutdown();
        Files.write(Paths.get(outFile), ("{\"sent\":" + sent + "}\n").getBytes(StandardCharsets.UTF_8));
    }

    private static void pull(String namesrv, String topics, String outFile) throws Exception {
        DefaultMQPullConsumer consumer = new DefaultMQPullConsumer("msgindex_test_reader");
        consumer.setNamesrvAddr(namesrv);
        consumer.start();
        try (PrintWriter out = new PrintWriter(Files.newBufferedWriter(Paths.get(outFile), StandardCharsets.UTF_8))) {
            for (String topic : topics.split(",")) {
                Set<MessageQueue> queues = new TreeSet<>(consumer.fetchSubscribeMessageQueues(topic));
                for (MessageQueue queue : queues) {
                    long offset = 0;
                    while (true) {
                        PullResult result = consumer.pull(queue, "*", offset, 32);
                        if (result.getPullStatus() != PullStatus.FOUND) {
                            break;
                        }
                        for (MessageExt msg : result.getMsgFoundList()) {
                            JSONObject row = new JSONObject();
                            row.put("topic", msg.getTopic());
                            row.put("queueId", msg.getQueueId());
                            row.put("queueOffset", msg.getQueueOffset());
                            row.put("commitLogOffset", msg.getCommitLogOffset());
                            row.put("storeTimestamp", msg.getStoreTimestamp());
                            row.put("storeSize", msg.getStoreSize());
                            row.put("msgId", msg.getMsgId());
                            row.put("sysFlag", msg.getSysFlag());
                            row.put("bodyB64", Base64.getEncoder().encodeToString(msg.getBody()));
                            row.put("properties", new JSONObject((Map) msg.getProperties()));
                            out.println(row.toJSONString());
                        }
                        offset = result.getNextBeginOffset();
                    }
                }
            }
        }
        consumer.shutdown();
    }

    private static List<JSONObject> readQueries(String file) throws Exception {
        List<JSONObject> queries = new ArrayList<>();
        for (String line : Files.readAllLines(Paths.get(file), StandardCharsets.UTF_8)) {
            if (!line.isEmpty()) {
                queries.add(JSON.parseObject(line));
            }
        }
        return queries;
    }

    private static DefaultMQAdminExt admin(String namesrv) throws MQClientException {
        DefaultMQAdminExt admin = new DefaultMQAdminExt(15000);
        admin.setNamesrvAddr(namesrv);
        admin.setInstanceName("msgindex_test_admin_" + System.nanoTime());
        admin.start();
        return admin;
    }

    private static List<MessageExt> ask(DefaultMQAdminExt admin, JSONObject q) throws Exception {
        try {
            QueryResult result = admin.queryMessage(q.getString("topic"), q.getString("key"), q.getIntValue("maxNum"),
                q.getLongValue("begin"), q.getLongValue("end"));
            return result.getMessageList();
        } catch (MQClientException e) {
            if (e.getResponseCode() == ResponseCode.NO_MESSAGE) {
                return new ArrayList<>();
            }
            throw e;
        }
    }

    private static void query(String namesrv, String queriesFile, String outFile) throws Exception {
        DefaultMQAdminExt admin = admin(namesrv);
        try (PrintWriter out = new PrintWriter(Files.newBufferedWriter(Paths.get(outFile), StandardCharsets.UTF_8))) {
            for (JSONObject q : readQueries(queriesFile)) {
                JSONArray offsets = new JSONArray();
                for (MessageExt msg : ask(admin, q)) {
                    offsets.add(msg.getCommitLogOffset());
                }
                JSONObject row = new JSONObject();
                row.put("offsets", offsets);
                out.println(row.toJSONString());
            }
        }
        admin.shutdown();
    }

    private static void bench(String namesrv, String queriesFile, int rounds, String outFile) throws Exception {
        DefaultMQAdminExt admin = admin(namesrv);
        List<JSONObject> queries = readQueries(queriesFile);
        for (JSONObject q : queries.subList(0, Math.min(queries.size(), 200))) {
            ask(admin, q);  // warm-up: routes, connections, JIT
        }
        long rows = 0;
        long start = System.nanoTime();
        for (int r = 0; r < rounds; r++) {
            for (JSONObject q : queries) {
                rows += ask(admin, q).size();
            }
        }
        double seconds = (System.nanoTime() - start) / 1e9;
        JSONObject row = new JSONObject();
        row.put("queries", (long) rounds * queries.size());
        row.put("rows", rows);
        row.put("seconds", seconds);
        Files.write(Paths.get(outFile), (row.toJSONString() + "\n").getBytes(StandardCharsets.UTF_8));
        admin.shutdown();
    }
}
