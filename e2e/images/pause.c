/*
 * kubegrace pause: the process that holds a pod sandbox's namespaces.
 * It does nothing but wait: exits 0 on SIGINT/SIGTERM and reaps any child
 * that gets re-parented to it (it is PID 1 of the pod when the PID namespace
 * is shared). Built statically: gcc -Os -static -o pause pause.c
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_shutdown(int sig) {
  (void)sig;
  _exit(0);
}

static void on_child(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "-v") == 0) {
    puts("kubegrace-pause 1");
    return 0;
  }
  if (getpid() != 1) fputs("warning: pause should be the first process\n", stderr);

  struct sigaction shutdown_action;
  memset(&shutdown_action, 0, sizeof shutdown_action);
  shutdown_action.sa_handler = on_shutdown;
  struct sigaction child_action;
  memset(&child_action, 0, sizeof child_action);
  child_action.sa_handler = on_child;
  child_action.sa_flags = SA_NOCLDSTOP;
  if (sigaction(SIGINT, &shutdown_action, NULL) < 0 || sigaction(SIGTERM, &shutdown_action, NULL) < 0 ||
      sigaction(SIGCHLD, &child_action, NULL) < 0) {
    perror("sigaction");
    return 1;
  }
  for (;;) pause();
}
