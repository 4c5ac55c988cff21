import org.apache.rocketmq.broker.BrokerController;
import org.apache.rocketmq.broker.BrokerStartup;
import org.apache.rocketmq.common.TopicConfig;
import org.apache.rocketmq.common.constant.PermName;
import org.apache.rocketmq.namesrv.NamesrvController;
import org.apache.rocketmq.namesrv.NamesrvStartup;

/**
 * A RocketMQ NameServer and Broker in one JVM (rocketmq-namesrv / rocketmq-broker from Maven
 * Central), each configured by its own properties file exactly like `mqnamesrv -c` and
 * `mqbroker -c`. Creates the given topics (QUEUES queues each), registers the broker with the
 * name server synchronously and then prints "READY": from then on clients find every route.
 * SIGTERM stops both through the shutdown hooks that NamesrvStartup and BrokerStartup register.
 *
 * args: namesrvConfigFile brokerConfigFile TOPICS(comma-separated) QUEUES
 */
public class RocketMqServer {
    public static void main(String[] args) throws Exception {
        NamesrvController namesrv = NamesrvStartup.main0(new String[] {"-c", args[0]});
        if (namesrv == null) {
            throw new IllegalStateException("the name server did not start");
        }
        BrokerController broker = BrokerStartup.start(BrokerStartup.createBrokerController(new String[] {"-c", args[1]}));
        if (broker == null) {
            throw new IllegalStateException("the broker did not start");
        }
        int queues = Integer.parseInt(args[3]);
        for (String topic : args[2].split(",")) {
            if (!topic.isEmpty()) {
                broker.getTopicConfigManager().updateTopicConfig(
                    new TopicConfig(topic, queues, queues, PermName.PERM_READ | PermName.PERM_WRITE));
            }
        }
        broker.registerBrokerAll(true, false, true);
        System.out.println("READY " + broker.getBrokerAddr());
        System.out.flush();
        Thread.currentThread().join();
    }
}
