// Swagger UI for the gateway's spec. The spec is fetched relative to this
// page (/docs/ -> /openapi.json), so the docs also work behind a path prefix.
// validatorUrl: null keeps the page from calling the public online validator.
window.addEventListener("load", function () {
  window.ui = SwaggerUIBundle({
    url: new URL("../openapi.json", window.location.href).toString(),
    dom_id: "#swagger-ui",
    deepLinking: true,
    validatorUrl: null,
    presets: [SwaggerUIBundle.presets.apis],
    layout: "BaseLayout",
  });
});
