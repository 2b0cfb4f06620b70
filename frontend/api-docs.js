// Starts Swagger UI on the API's OpenAPI schema (/api/docs). A file, not an inline script: the
// server's CSP (script-src 'self') runs no inline code.
window.ui = SwaggerUIBundle({
  url: document.body.dataset.openapiUrl,
  dom_id: '#swagger-ui',
  presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
  layout: 'BaseLayout',
  deepLinking: true,
  validatorUrl: null, // no badge from a third-party validator: the page talks to this server only
});
