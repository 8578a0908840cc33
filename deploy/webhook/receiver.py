"""Alertmanager webhook receiver of docker-compose.yml: prints each notification as on-call would
read it (route, status, alert name, severity, node, summary). Usage: python receiver.py [PORT]"""

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        for alert in body.get("alerts", []):
            labels, notes = alert.get("labels", {}), alert.get("annotations", {})
            print(f"{self.path.strip('/') or 'webhook'} {alert.get('status', '?').upper():8} "
                  f"{labels.get('alertname', '?')} severity={labels.get('severity', '-')} "
                  f"node={labels.get('node', '-')} gpu={labels.get('gpu', labels.get('uuid', '-'))} "
                  f"{notes.get('summary', '')}", flush=True)
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    ThreadingHTTPServer(("0.0.0.0", int(sys.argv[1]) if len(sys.argv) > 1 else 5001), Handler).serve_forever()
