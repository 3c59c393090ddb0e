/*
 * The pod sandbox process containerd's CRI starts first in every pod (the image it names
 * `registry.k8s.io/pause:<version>`). Built here, statically, because no image registry is reachable
 * from the local platform. It holds the pod's namespaces open, reaps orphaned children (it is PID 1
 * of the pod when the pod shares its PID namespace) and exits cleanly on SIGINT/SIGTERM.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) {
    (void)sig;
    _exit(0);
}

static void reap(int sig) {
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction sa = {0};
    sa.sa_handler = stop;
    if (sigaction(SIGINT, &sa, NULL) < 0 || sigaction(SIGTERM, &sa, NULL) < 0) {
        perror("pause: sigaction");
        return 1;
    }
    sa.sa_handler = reap;
    sa.sa_flags = SA_NOCLDSTOP;
    if (sigaction(SIGCHLD, &sa, NULL) < 0) {
        perror("pause: sigaction");
        return 1;
    }
    if (getpid() != 1) {
        fprintf(stderr, "pause: warning: not PID 1\n");
    }
    for (;;) {
        pause();
    }
}
