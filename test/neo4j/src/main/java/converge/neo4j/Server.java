package converge.neo4j;

import java.io.IOException;
import java.io.PrintStream;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CountDownLatch;

import org.neo4j.configuration.GraphDatabaseSettings;
import org.neo4j.configuration.connectors.BoltConnector;
import org.neo4j.configuration.connectors.HttpConnector;
import org.neo4j.configuration.connectors.HttpsConnector;
import org.neo4j.configuration.helpers.SocketAddress;
import org.neo4j.configuration.ssl.ClientAuth;
import org.neo4j.configuration.ssl.SslPolicyConfig;
import org.neo4j.configuration.ssl.SslPolicyScope;
import org.neo4j.dbms.api.DatabaseManagementService;
import org.neo4j.dbms.api.DatabaseManagementServiceBuilder;
import org.neo4j.graphdb.GraphDatabaseService;

/**
 * A real Neo4j 5 Community DBMS with its Bolt connector on 127.0.0.1, for
 * converge's tests and demo. Authentication is on: the user neo4j gets the
 * password given, with no change required.
 *
 * <p>Usage: {@code Server --dir DIR --password PW [--instances N]
 * [--parent-pid PID] [--tx-memory BYTES] [--bolt-tls CERTDIR] [--remove-dir]}. Each instance is a DBMS of its
 * own (Community has one user database per DBMS), in DIR/instance-I, on a
 * free port. Once every instance answers, DIR/server.env is written
 * (atomically) with one line per setting, and the same lines are printed:
 * CONVERGE_NEO4J_URL, _USER and _PASSWORD for the first instance, and
 * CONVERGE_NEO4J_URLS with every instance's URL, comma-separated.
 *
 * <p>With --bolt-tls, Bolt offers TLS too, on the same port (encryption
 * level OPTIONAL: a client chooses bolt:// or bolt+s://), with the key pair
 * CERTDIR/server.key (PKCS #8) and CERTDIR/server.crt; clients present no
 * certificate. Plain Bolt stays, so that the tests that use it are
 * unaffected.
 *
 * <p>The process stops cleanly on SIGTERM or SIGINT, and when the process
 * named by --parent-pid ends, however it ends; with --remove-dir it then
 * deletes DIR.
 */
public final class Server {
    private Server() {}

    public static void main(String[] args) throws Exception {
        Path dir = null;
        String password = null;
        int instances = 1;
        long parentPid = -1;
        long txMemory = 0;
        boolean removeDir = false;
        Path boltTls = null;
        for (int i = 0; i < args.length; i++) {
            String value = i + 1 < args.length ? args[i + 1] : null;
            switch (args[i]) {
                case "--dir" -> { dir = Path.of(require(args[i], value)); i++; }
                case "--password" -> { password = require(args[i], value); i++; }
                case "--instances" -> { instances = Integer.parseInt(require(args[i], value)); i++; }
                case "--parent-pid" -> { parentPid = Long.parseLong(require(args[i], value)); i++; }
                case "--tx-memory" -> { txMemory = Long.parseLong(require(args[i], value)); i++; }
                case "--bolt-tls" -> { boltTls = Path.of(require(args[i], value)).toAbsolutePath(); i++; }
                case "--remove-dir" -> removeDir = true;
                default -> fail("unknown argument " + args[i]);
            }
        }
        if (dir == null || password == null) {
            fail("usage: Server --dir DIR --password PW [--instances N] [--parent-pid PID] [--tx-memory BYTES] [--bolt-tls CERTDIR] [--remove-dir]");
        }
        if (password.length() < 8) {
            fail("the password must have at least 8 characters (Neo4j's minimum)");
        }
        if (instances < 1 || instances > 16) {
            fail("--instances must be 1..16");
        }
        Files.createDirectories(dir);
        Path envFile = dir.resolve("server.env");
        Files.deleteIfExists(envFile);

        List<DatabaseManagementService> started = new ArrayList<>();
        Path serverDir = dir;
        boolean removeDirAtExit = removeDir;
        CountDownLatch stopped = new CountDownLatch(1);
        // The instances stop in parallel: each waits seconds for its Bolt
        // threads, which would add up.
        Runnable shutdown = () -> {
            List<Thread> stopping = new ArrayList<>();
            synchronized (started) {
                for (DatabaseManagementService dbms : started) {
                    Thread t = new Thread(() -> {
                        try {
                            dbms.shutdown();
                        } catch (RuntimeException e) {
                            System.err.println("neo4j-server: shutdown: " + e);
                        }
                    });
                    t.start();
                    stopping.add(t);
                }
                started.clear();
            }
            for (Thread t : stopping) {
                try {
                    t.join();
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
            }
            if (removeDirAtExit) {
                removeTree(serverDir);
            }
            stopped.countDown();
        };
        Runtime.getRuntime().addShutdownHook(new Thread(shutdown, "neo4j-shutdown"));
        if (parentPid > 0) {
            ProcessHandle parent = ProcessHandle.of(parentPid).orElse(null);
            if (parent == null) {
                fail("parent process " + parentPid + " is not running");
            }
            long watched = parentPid;
            parent.onExit().thenRun(() -> {
                System.err.println("neo4j-server: parent process " + watched + " ended; stopping");
                System.exit(0); // runs the shutdown hook
            });
        }

        List<String> urls = new ArrayList<>();
        for (int i = 0; i < instances; i++) {
            int port = freePort();
            Path home = dir.resolve("instance-" + i);
            DatabaseManagementServiceBuilder builder = new DatabaseManagementServiceBuilder(home)
                    .setConfig(BoltConnector.enabled, true)
                    .setConfig(BoltConnector.listen_address, new SocketAddress("127.0.0.1", port))
                    .setConfig(BoltConnector.advertised_address, new SocketAddress("127.0.0.1", port))
                    .setConfig(HttpConnector.enabled, false)
                    .setConfig(HttpsConnector.enabled, false)
                    .setConfig(GraphDatabaseSettings.auth_enabled, true)
                    .setConfig(GraphDatabaseSettings.pagecache_memory, 64L * 1024 * 1024)
                    .setConfig(GraphDatabaseSettings.check_point_interval_time, Duration.ofMinutes(5));
            if (txMemory > 0) {
                builder.setConfig(GraphDatabaseSettings.memory_transaction_max_size, txMemory);
            }
            if (boltTls != null) {
                SslPolicyConfig policy = SslPolicyConfig.forScope(SslPolicyScope.BOLT);
                builder.setConfig(BoltConnector.encryption_level, BoltConnector.EncryptionLevel.OPTIONAL)
                        .setConfig(policy.enabled, true)
                        .setConfig(policy.base_directory, boltTls)
                        .setConfig(policy.private_key, boltTls.resolve("server.key"))
                        .setConfig(policy.public_certificate, boltTls.resolve("server.crt"))
                        .setConfig(policy.client_auth, ClientAuth.NONE);
            }
            DatabaseManagementService dbms = builder.build();
            synchronized (started) {
                started.add(dbms);
            }
            GraphDatabaseService system = dbms.database(GraphDatabaseSettings.SYSTEM_DATABASE_NAME);
            system.executeTransactionally("ALTER USER neo4j SET PASSWORD $password CHANGE NOT REQUIRED",
                    Map.of("password", password));
            // The user database answers before Bolt is announced.
            dbms.database(GraphDatabaseSettings.DEFAULT_DATABASE_NAME).executeTransactionally("RETURN 1");
            urls.add("bolt://127.0.0.1:" + port);
        }

        StringBuilder env = new StringBuilder();
        env.append("CONVERGE_NEO4J_URL=").append(urls.get(0)).append('\n');
        env.append("CONVERGE_NEO4J_USER=neo4j\n");
        env.append("CONVERGE_NEO4J_PASSWORD=").append(password).append('\n');
        env.append("CONVERGE_NEO4J_URLS=").append(String.join(",", urls)).append('\n');
        Path tmp = dir.resolve("server.env.tmp");
        Files.writeString(tmp, env.toString(), StandardCharsets.UTF_8);
        Files.move(tmp, envFile, StandardCopyOption.ATOMIC_MOVE);
        PrintStream out = System.out;
        out.print(env);
        out.flush();
        stopped.await();
    }

    private static void removeTree(Path root) {
        try (var paths = Files.walk(root)) {
            paths.sorted(java.util.Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
        } catch (IOException e) {
            System.err.println("neo4j-server: removing " + root + ": " + e);
        }
    }

    private static int freePort() throws IOException {
        try (ServerSocket s = new ServerSocket()) {
            s.setReuseAddress(true);
            s.bind(new InetSocketAddress("127.0.0.1", 0));
            return s.getLocalPort();
        }
    }

    private static String require(String flag, String value) {
        if (value == null) {
            fail(flag + " needs a value");
        }
        return value;
    }

    private static void fail(String message) {
        System.err.println("neo4j-server: " + message);
        System.exit(2);
    }
}
