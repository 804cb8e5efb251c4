import java.lang.management.ManagementFactory;
import java.util.Map;
import javax.management.Attribute;
import javax.management.AttributeList;
import javax.management.AttributeNotFoundException;
import javax.management.DynamicMBean;
import javax.management.MBeanAttributeInfo;
import javax.management.MBeanInfo;
import javax.management.MBeanServer;
import javax.management.ObjectName;

/**
 * MBeans shaped like the ones a MirrorMaker 2 worker registers (Kafka's JmxReporter: one
 * DynamicMBean per metric group, attributes named like the metrics, with dashes), so the JMX
 * exporter agent can run infra/jmx/mirrormaker2.yaml against them without a Connect cluster.
 *
 * Usage: java -javaagent:...=host:port:rules FakeMirrorMaker "objectName|attribute|value" ...
 * A value that parses as a number is a Double, else a String. Runs until stdin closes.
 */
public final class FakeMirrorMaker {
    private static final class Bean implements DynamicMBean {
        private final Map<String, Object> values = new java.util.LinkedHashMap<>();

        @Override
        public Object getAttribute(String name) throws AttributeNotFoundException {
            if (!values.containsKey(name)) {
                throw new AttributeNotFoundException(name);
            }
            return values.get(name);
        }

        @Override
        public void setAttribute(Attribute attribute) {
            throw new UnsupportedOperationException();
        }

        @Override
        public AttributeList getAttributes(String[] names) {
            AttributeList out = new AttributeList();
            for (String n : names) {
                if (values.containsKey(n)) {
                    out.add(new Attribute(n, values.get(n)));
                }
            }
            return out;
        }

        @Override
        public AttributeList setAttributes(AttributeList attributes) {
            return new AttributeList();
        }

        @Override
        public Object invoke(String action, Object[] params, String[] signature) {
            throw new UnsupportedOperationException(action);
        }

        @Override
        public MBeanInfo getMBeanInfo() {
            MBeanAttributeInfo[] attrs = values.entrySet().stream()
                    .map(e -> new MBeanAttributeInfo(e.getKey(), e.getValue().getClass().getName(),
                            e.getKey(), true, false, false))
                    .toArray(MBeanAttributeInfo[]::new);
            return new MBeanInfo(Bean.class.getName(), "fake", attrs, null, null, null);
        }
    }

    public static void main(String[] args) throws Exception {
        MBeanServer server = ManagementFactory.getPlatformMBeanServer();
        Map<String, Bean> beans = new java.util.LinkedHashMap<>();
        for (String arg : args) {
            String[] parts = arg.split("\\|", 3);
            Object value;
            try {
                value = Double.valueOf(parts[2]);
            } catch (NumberFormatException e) {
                value = parts[2];
            }
            beans.computeIfAbsent(parts[0], k -> new Bean()).values.put(parts[1], value);
        }
        for (Map.Entry<String, Bean> e : beans.entrySet()) {
            server.registerMBean(e.getValue(), new ObjectName(e.getKey()));
        }
        System.out.println("registered " + beans.size());
        System.out.flush();
        while (System.in.read() != -1) {
            // until the test closes our stdin
        }
    }
}
