/* The lab's pod sandbox process (`lab --runtime containerd`): what the
 * Kubernetes pause container does. It holds the pod's namespaces, exits on
 * SIGTERM/SIGINT and, as PID 1 of the pod, reaps orphaned children. Built
 * static by harness/build.rs and packed into an OCI image by the harness. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static void quit(int sig) {
    (void)sig;
    _exit(0);
}

static void reap(int sig) {
    (void)sig;
    while (waitpid(-1, 0, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction sa = {0};
    sa.sa_handler = quit;
    sigaction(SIGTERM, &sa, 0);
    sigaction(SIGINT, &sa, 0);
    sa.sa_handler = reap;
    sa.sa_flags = SA_NOCLDSTOP;
    sigaction(SIGCHLD, &sa, 0);
    for (;;) {
        pause();
    }
}
