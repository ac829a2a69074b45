// redis-server processes for the live tests (TLS, Sentinel): whether redis-server is
// installed, a free loopback port, and one child process per server that is killed and
// reaped when its owner goes.
//
//   const int port = rctest::free_port();
//   rctest::ServerProcess p({"redis-server", "--port", std::to_string(port)}, port, dir / "log");
//   ... poll until it answers (never sleep a fixed time) ...
//   p.kill();  // or let the destructor do it
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "redcount/common/address.h"

namespace rctest {

// True when an executable redis-server is on PATH (the live tests skip, by name, otherwise).
inline bool have_redis_server() {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "");
  for (std::string d; std::getline(dirs, d, ':');) {
    if (!d.empty() && ::access((std::filesystem::path(d) / "redis-server").c_str(), X_OK) == 0) return true;
  }
  return false;
}

// A loopback port nothing listened on a moment ago (the kernel's pick); 0 if none. Another
// process may take it before the server binds it: launchers retry on another port.
inline int free_port() {
  const int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = 0;
  if (::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  ::close(s);
  return port;
}

// A blocking TCP connect to 127.0.0.1:port; -1 when nothing listens.
inline int try_connect(int port) {
  const int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(s);
    return -1;
  }
  return s;
}

// One redis-server child (a data node or a sentinel; `args` is its whole argv, "redis-server"
// first) that is to listen on 127.0.0.1:port and log to `log`; SIGKILLed and reaped by
// kill() or the destructor.
class ServerProcess {
 public:
  ServerProcess(std::vector<std::string> args, int port, std::filesystem::path log)
      : port_(port), log_(std::move(log)) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::execvp("redis-server", argv.data());
      ::_exit(127);
    }
  }
  ~ServerProcess() { kill(); }
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  // False when fork() failed.
  bool started() const { return pid_ > 0 || exited_; }
  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  // True once the process is gone (reaped here, so kill() never signals a reused pid).
  bool exited() {
    if (pid_ > 0 && ::waitpid(pid_, nullptr, WNOHANG) == pid_) {
      pid_ = -1;
      exited_ = true;
    }
    return pid_ <= 0;
  }
  int port() const { return port_; }
  redcount::Address address() const { return {"127.0.0.1", port_}; }
  std::string log() const {
    std::ifstream in(log_);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

 private:
  pid_t pid_ = -1;
  bool exited_ = false;
  int port_;
  std::filesystem::path log_;
};

}  // namespace rctest
