// everystep's operator UI: live updates.
//
// A page names its stream in <body data-stream="...">. Each `change` event
// from the stream (Server-Sent Events) makes the page's live part fetch
// itself again (htmx, on the `everystep:changed` event). Without
// EventSource, when the stream is refused, or when it goes silent (a proxy
// that buffers it), the page polls every second instead. `?live=poll`
// asks for polling outright.
(function () {
  "use strict";
  var body = document.body;
  var streamUrl = body.getAttribute("data-stream");
  if (!streamUrl || !window.htmx) {
    return;
  }
  var POLL_MS = 1000;
  var SILENT_MS = 12000;
  var source = null;
  var polling = null;
  var lastMessage = Date.now();

  function changed() {
    window.htmx.trigger(body, "everystep:changed");
  }

  function heard() {
    lastMessage = Date.now();
  }

  function poll() {
    if (polling !== null) {
      return;
    }
    if (source !== null) {
      source.close();
      source = null;
    }
    body.setAttribute("data-live", "polling");
    polling = window.setInterval(changed, POLL_MS);
  }

  function listen() {
    source = new window.EventSource(streamUrl);
    body.setAttribute("data-live", "connecting");
    source.addEventListener("open", function () {
      heard();
      body.setAttribute("data-live", "stream");
    });
    source.addEventListener("change", function () {
      heard();
      changed();
    });
    source.addEventListener("ping", heard);
    source.addEventListener("gone", function () {
      changed();
    });
    source.addEventListener("error", function () {
      if (source !== null && source.readyState === window.EventSource.CLOSED) {
        poll();
      }
    });
    window.setInterval(function () {
      if (polling === null && Date.now() - lastMessage > SILENT_MS) {
        poll();
      }
    }, POLL_MS);
  }

  var asked = new window.URLSearchParams(window.location.search).get("live");
  if (!window.EventSource || asked === "poll") {
    poll();
  } else {
    listen();
  }
})();
