import io.fabric8.kubernetes.client.server.mock.KubernetesMixedDispatcher;
import io.fabric8.kubernetes.client.server.mock.KubernetesMockServer;
import io.fabric8.mockwebserver.Context;
import io.fabric8.mockwebserver.MockWebServer;
import io.fabric8.mockwebserver.ServerRequest;
import io.fabric8.mockwebserver.ServerResponse;
import io.fabric8.mockwebserver.dsl.HttpMethod;
import io.fabric8.mockwebserver.http.Buffer;
import io.fabric8.mockwebserver.http.Dispatcher;
import io.fabric8.mockwebserver.http.MockResponse;
import io.fabric8.mockwebserver.http.RecordedRequest;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.dataformat.yaml.YAMLFactory;

import java.net.InetAddress;
import java.util.HashMap;
import java.util.Map;
import java.util.Queue;

/**
 * A mock Kubernetes API server (fabric8's, CRUD mode, plain HTTP, 127.0.0.1 only) that the tests' real spark-submit
 * deploys a batch's driver pod to, so that the pod it asks for can be read back (scripts/stack.sh kubernetes-mock).
 */
public class MockKubeServer {

  private static final ObjectMapper YAML = new ObjectMapper(new YAMLFactory());
  private static final ObjectMapper JSON = new ObjectMapper();

  /**
   * The CRUD dispatcher has no server-side apply (PATCH application/apply-patch+yaml: 415, or 404 if absent).
   * Emulate it: create (POST to the collection) when the object does not exist, else JSON merge patch.
   */
  static MockResponse serverSideApply(Dispatcher crud, RecordedRequest req) {
    try {
      String path = req.getPath();
      int q = path.indexOf('?');
      if (q >= 0) path = path.substring(0, q);
      byte[] json = JSON.writeValueAsBytes(YAML.readTree(req.getBody().getBytes()));
      MockResponse existing = crud.dispatch(new RecordedRequest(req.getHttpVersion(), HttpMethod.GET, path,
          req.getHeaders().newBuilder().removeAll("Content-Type").build(), new Buffer()));
      boolean exists = existing.getStatus().contains(" 200 ");
      String target = exists ? path : path.substring(0, path.lastIndexOf('/'));
      return crud.dispatch(new RecordedRequest(req.getHttpVersion(), exists ? HttpMethod.PATCH : HttpMethod.POST, target,
          req.getHeaders().newBuilder()
              .set("Content-Type", exists ? "application/merge-patch+json" : "application/json").build(),
          new Buffer(json)));
    } catch (Exception e) {
      return new MockResponse().setResponseCode(400).setBody("{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"status\":\"Failure\",\"message\":"
          + JSON.valueToTree(String.valueOf(e)) + ",\"code\":400}");
    }
  }

  // strong reference: keep MockWebServer's per-request INFO logging (java.util.logging) quiet; we log below instead
  private static final java.util.logging.Logger MWS_LOG = java.util.logging.Logger.getLogger("io.fabric8.mockwebserver");

  public static void main(String[] args) throws Exception {
    MWS_LOG.setLevel(java.util.logging.Level.WARNING);
    int port = args.length > 0 ? Integer.parseInt(args[0]) : 17443;
    Map<ServerRequest, Queue<ServerResponse>> responses = new HashMap<>();
    // Mixed = CRUD dispatcher (KubernetesCrudDispatcher) + the expectations KubernetesMockServer registers for / and /version
    Dispatcher crud = new KubernetesMixedDispatcher(responses);
    Dispatcher logging = new Dispatcher() {
      @Override
      public MockResponse dispatch(RecordedRequest req) {
        String ct = req.getHeader("Content-Type");
        MockResponse resp = "PATCH".equals(req.getMethod()) && ct != null && ct.startsWith("application/apply-patch")
            ? serverSideApply(crud, req)
            : crud.dispatch(req);
        System.err.println("[mock-k8s] " + req.getMethod() + " " + req.getPath() + " -> " + resp);
        return resp;
      }
    };
    MockWebServer web = new MockWebServer();
    KubernetesMockServer server = new KubernetesMockServer(new Context(), web, responses, logging, false);
    server.init(InetAddress.getByName("127.0.0.1"), port);
    // MockWebServer records every request in an unbounded queue; drain it so a long-running server does not grow.
    Thread drain = new Thread(() -> {
      try {
        while (true) web.takeRequest();
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
      }
    }, "request-drain");
    drain.setDaemon(true);
    drain.start();
    Runtime.getRuntime().addShutdownHook(new Thread(server::destroy));
    System.out.println("mock kubernetes api listening on http://127.0.0.1:" + server.getPort());
    System.out.flush();
    Thread.currentThread().join();
  }
}
